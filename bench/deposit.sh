#!/usr/bin/env bash
# The deposit seed's application study (E-D4, its Figures 11-14): the 2D-FFT and SOR
# kernels over the seed's three libraries on one `Rma` (PVM-like, RRMSG, DMSG), each
# run's time split into compute, transfer, control, gather/scatter and pack/unpack
# (`examples/deposit_study.rs`; every figure the slowest rank's). For each kernel, N in
# SIZES and library: inside the node with 2 and 4 ranks (RANKS) and, with CLUSTER=1 (as
# root), on an emulated cluster of NODES nodes with LINK links, one rank per node, raw
# Ethernet. Beside them the kernel's serial time (`--serial`, one core, no quiver).
# Medians over the REPS runs of one process (after a warm-up run that is not counted).
# Every run's result is checked on rank 0 against a serial computation: a combination
# whose runs did not all pass is marked in the last column.
#
# usage: bash bench/deposit.sh          (REPS=3; about 2 minutes inside the node)
#        CLUSTER=1 bash bench/deposit.sh   (root: adds the cluster, 4 nodes, 1 Gbit/s)
# Other knobs: KERNELS="fft sor", SIZES="256 4096", LIBS="pvm rrmsg dmsg", RANKS="2 4",
# NODES=4, LINK=1gbit, TIMEOUT=600 (seconds per run), DMSG_EXTRA="--tile 64,--r 1"
# (comma-separated: extra DMSG runs of the FFT with these options, labelled with them:
# strided puts of 64 rows, tile by tile, rather than one per source column; a
# congestion-control barrier after every round of the all-to-all rather than none;
# DMSG_EXTRA= for none). QUIVER_* variables (QUIVER_WAIT, QUIVER_RELIABILITY...) reach
# the ranks.
# Raw records: target/bench-deposit/records.tsv (kernel, n, where, ranks, lib, rep,
# compute, transfer, control, gather_scatter, pack_unpack, total, comm in seconds,
# verified);
# the commands and their output: target/bench-deposit/raw.log.
set -euo pipefail
REPS=${REPS:-3}
KERNELS=${KERNELS:-fft sor}
SIZES=${SIZES:-256 4096}
LIBS=${LIBS:-pvm rrmsg dmsg}
RANKS=${RANKS:-2 4}
CLUSTER=${CLUSTER:-0}
NODES=${NODES:-4}
LINK=${LINK:-1gbit}
DMSG_EXTRA=${DMSG_EXTRA-"--tile 64,--r 1"}
TIMEOUT=${TIMEOUT:-600}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/bench-deposit
mkdir -p "$out"
cd "$root"
source bench/lib.sh
if [ "$CLUSTER" = 1 ] && [ "$(id -u)" != 0 ]; then
    echo "bench/deposit.sh: CLUSTER=1 needs root (emulated clusters)" >&2
    exit 1
fi
building cargo build --release -q -p quiver-cli -p quiver --example deposit_study
Q=$root/target/release/quiver
prog=$root/target/release/examples/deposit_study
rec=$out/records.tsv
raw=$out/raw.log
: > "$rec"
: > "$raw"
failed=0
cluster=""
cleanup() { if [ -n "$cluster" ]; then "$Q" cluster down "$cluster" >/dev/null 2>&1 || true; cluster=""; fi; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

record() {   # record WHERE LABEL < the program's output
    python3 -c '
import json, sys
where, label = sys.argv[1:]
for line in sys.stdin:
    line = line.split("] ", 1)[-1].strip()
    if not line.startswith("{"):
        continue
    o = json.loads(line)
    if o.get("bench") != "deposit":
        continue
    lib = label or o["lib"]
    print(o["kernel"], o["n"], where, o["ranks"], lib, o["rep"], *(o[k] for k in
          ("compute", "transfer", "control", "gather_scatter", "pack_unpack", "total", "comm")),
          "yes" if o["verified"] else "no", sep="\t")' "$1" "$2" >> "$rec"
}
run() {   # run WHERE LABEL COMMAND...: one timed process, its JSON lines recorded
    local where=$1 label=$2; shift 2
    echo "== $(show "$@")" >> "$raw"
    local status=0
    locked "$@" > "$out/last.out" 2>> "$raw" || status=$?
    cat "$out/last.out" >> "$raw"
    record "$where" "$label" < "$out/last.out"
    if [ "$status" != 0 ]; then
        echo "bench/deposit.sh: exit status $status: $(show "$@") (see $raw)" >&2
        failed=1
    fi
}
study() {   # study WHERE N [quiver run args...]: every kernel, size and library on N ranks
    local where=$1 n=$2 kernel size lib extra extras; shift 2
    IFS=, read -r -a extras <<< "$DMSG_EXTRA"
    for kernel in $KERNELS; do
        for size in $SIZES; do
            echo "[$(date +%H:%M:%S)] $where, $n ranks: $kernel N=$size" >&2
            for lib in $LIBS; do
                run "$where" "" "$Q" run --timeout "$TIMEOUT" -n "$n" "$@" -- \
                    "$prog" --kernel "$kernel" --n "$size" --lib "$lib" --reps "$REPS"
            done
            if [ "$kernel" = fft ]; then
                for extra in "${extras[@]}"; do
                    # shellcheck disable=SC2086 # the options split into words
                    run "$where" "dmsg $extra" "$Q" run --timeout "$TIMEOUT" -n "$n" "$@" -- \
                        "$prog" --kernel fft --n "$size" --lib dmsg $extra --reps "$REPS"
                done
            fi
        done
    done
}

for kernel in $KERNELS; do
    for size in $SIZES; do
        echo "[$(date +%H:%M:%S)] serial: $kernel N=$size" >&2
        run serial "" timeout "$TIMEOUT" "$prog" --serial --kernel "$kernel" --n "$size" --reps "$REPS"
    done
done
for n in $RANKS; do
    study node "$n"
done
if [ "$CLUSTER" = 1 ]; then
    cluster=qvdep$$
    echo "[$(date +%H:%M:%S)] cluster up: $NODES nodes, --link $LINK" >&2
    "$Q" cluster up "$cluster" --nodes "$NODES" --link "$LINK" >> "$raw" 2>&1 \
        || { echo "bench/deposit.sh: quiver cluster up failed (see $raw)" >&2; exit 1; }
    QUIVER_TRANSPORT=eth study cluster "$NODES" --cluster "$cluster"
    "$Q" cluster down "$cluster" >> "$raw" 2>&1 || true
    cluster=""
fi

python3 - "$rec" "$LINK" "$NODES" <<'PY'
import sys, statistics as st
from collections import defaultdict
rec, link, nodes = sys.argv[1:]
R = defaultdict(list)
for line in open(rec):
    k, n, where, ranks, lib, rep, *v, ok = line.rstrip("\n").split("\t")
    R[(k, int(n), where, int(ranks), lib)].append(([float(x) for x in v], ok == "yes"))
def med(runs, i):
    return st.median(r[0][i] for r in runs) * 1e3
def comm(runs):
    return med(runs, 6)
wheres = {"node": "inside the node", "cluster": f"emulated cluster, {nodes} nodes, {link}, raw Ethernet"}
order = {"pvm": 0, "rrmsg": 1, "dmsg": 2}
print("Times in ms, medians over the runs; every figure is the slowest rank's, each taken")
print("separately (the parts need not add up to total); comm: total - compute on a rank")
print("(communication and waits for other ranks); PVM comm / comm: how many times less time")
print("than PVM the library spends communicating; serial: the kernel's total on one core")
print("without quiver.\n")
print("| kernel | N | where | ranks | lib | compute | transfer | control | gather/scatter "
      "| pack/unpack | total | comm | PVM comm / comm | serial | verified |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
keys = [k for k in R if k[2] != "serial"]
keys.sort(key=lambda k: (k[0], k[1], k[2] != "node", k[3], order.get(k[4], 3), k[4]))
for k in keys:
    runs = R[k]
    kernel, n, where, ranks, lib = k
    serial = R.get((kernel, n, "serial", 1, "serial"))
    pvm = R.get((kernel, n, where, ranks, "pvm"))
    ratio = f"{comm(pvm) / comm(runs):.1f}" if pvm and comm(runs) > 0 else "-"
    cells = [f"{med(runs, i):.2f}" for i in range(7)] + [ratio]
    cells.append(f"{med(serial, 5):.2f}" if serial else "-")
    ok = sum(r[1] for r in runs)
    cells.append("yes" if ok == len(runs) else f"NO ({ok}/{len(runs)})")
    print(f"| {kernel} | {n} | {wheres.get(where, where)} | {ranks} | {lib} | " + " | ".join(cells) + " |")
bad = [k for k in R if not all(r[1] for r in R[k])]
if bad:
    print(f"\nNOT VERIFIED: {len(bad)} combination(s) computed a wrong result", file=sys.stderr)
    sys.exit(1)
PY
exit "$failed"
