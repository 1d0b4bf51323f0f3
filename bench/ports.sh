#!/usr/bin/env bash
# GAMMA's ports beside the Directed Point endpoints they stand on, in one run: ping-pong
# one-way latency (8 B, 1 KiB, 64 KiB) and bandwidth (64 KiB, 1 MiB) with `--api ports`
# and `--api dm`, alternating within each repetition (the order reversed on even ones),
# over shared memory, UDP on loopback, and raw Ethernet between the two nodes of an
# unshaped emulated cluster (`quiver cluster up`, removed at exit). Ranks pinned to cores
# 0 and 1 (quiver bench's default). Prints per transport and size the median over
# repetitions of each API's median one-way time, and the ports / endpoints ratio of each
# repetition (paired).
#
# usage: bash bench/ports.sh            (REPS=5; about 4 minutes)
#        TRANSPORTS="shm udp" REPS=3 bash bench/ports.sh
# Raw records: target/bench-ports/records.tsv (transport, bench, size, api, rep, value)
set -euo pipefail
REPS=${REPS:-5}
TRANSPORTS=${TRANSPORTS:-shm udp eth}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/bench-ports
mkdir -p "$out"
cd "$root"
source bench/lib.sh
building cargo build --release -q -p quiver-cli
Q=$root/target/release/quiver
rec=$out/records.tsv
: > "$rec"
cluster=""
cleanup() { [ -n "$cluster" ] && "$Q" cluster down "$cluster" >/dev/null 2>&1; true; }
trap cleanup EXIT INT TERM
case " $TRANSPORTS " in *" eth "*)
    cluster=qv-ports-$$
    "$Q" cluster up "$cluster" --nodes 2 >/dev/null ;;
esac

run() {   # run TRANSPORT BENCH API SIZES ITERS REP
    local tr=$1 bench=$2 api=$3 sizes=$4 iters=$5 rep=$6 where=()
    [ "$tr" = eth ] && where=(--cluster "$cluster")
    locked "$Q" bench "$bench" --api "$api" --transport "$tr" "${where[@]}" --sizes "$sizes" \
        --iters "$iters" --wait spin --format json 2>/dev/null | grep '^{' | python3 -c '
import json, sys
tr, api, rep = sys.argv[1:]
for line in sys.stdin:
    o = json.loads(line)
    v = o["latency_us_median"] if o["bench"] == "pingpong" else o["bandwidth_MBps"]
    print(tr, o["bench"], o["size"], api, rep, v, sep="\t")' "$tr" "$api" "$rep" >> "$rec"
}

for rep in $(seq "$REPS"); do
    apis=(dm ports)
    [ $((rep % 2)) = 0 ] && apis=(ports dm)
    for tr in $TRANSPORTS; do
        echo "repetition $rep/$REPS: $tr" >&2
        for api in "${apis[@]}"; do
            run "$tr" pingpong "$api" 8,1K,64K 20000 "$rep"
            run "$tr" bw "$api" 64K,1M 50 "$rep"
        done
    done
done

python3 - "$rec" <<'EOF'
import sys, statistics as st
from collections import defaultdict
R = defaultdict(dict)
for line in open(sys.argv[1]):
    tr, bench, size, api, rep, v = line.rstrip("\n").split("\t")
    R[(tr, bench, int(size), api)][int(rep)] = float(v)
print("| transport | bench | size | endpoints (dm) | ports | ports / endpoints (median of paired) | per repetition |")
print("|---|---|---|---|---|---|---|")
for (tr, bench, size, api) in sorted(R, key=lambda k: (k[0], k[1] != "pingpong", k[1], k[2])):
    if api != "dm":
        continue
    dm, po = R[(tr, bench, size, "dm")], R.get((tr, bench, size, "ports"), {})
    reps = sorted(set(dm) & set(po))
    ratios = [po[r] / dm[r] for r in reps if dm[r] > 0]
    unit = "µs" if bench == "pingpong" else "MB/s"
    print(f"| {tr} | {bench} | {size} | {st.median(dm.values()):.3f} {unit} | "
          f"{st.median(po.values()):.3f} {unit} | {st.median(ratios):.3f} | "
          + ", ".join(f"{x:.2f}" for x in ratios) + " |")
EOF
