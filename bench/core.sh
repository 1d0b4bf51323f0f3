#!/usr/bin/env bash
# Core performance figures of quiver beside the physical limits, in one run.
#
# For each repetition, alternating: the anchors of ../shared/bench/anchors/limits
# (cache-line ping-pong, memcpy, raw UDP ping-pong) and `quiver bench` on the same sizes,
# every pair of processes pinned to cores 0 and 1. Prints median (min-max) per figure and
# the ratio quiver / limit, and writes the raw records to target/bench-core/records.tsv.
#
# usage: bash bench/core.sh            (REPS=5 by default; ~3 minutes)
set -euo pipefail
REPS=${REPS:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
anchors=${ANCHORS:-$root/../shared/bench/anchors}
out=$root/target/bench-core
mkdir -p "$out"
cd "$root"

[ -d "$anchors/limits" ] || { echo "bench/core.sh: anchors not found at $anchors (set ANCHORS=DIR)" >&2; exit 1; }
for p in shm_pingpong memcpy_bw udp_pingpong; do
    gcc -O2 -Wall -o "$out/$p" "$anchors/limits/$p.c"
done
cargo build --release -q -p quiver-cli
Q=$root/target/release/quiver
rec=$out/records.tsv
: > "$rec"
num() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -1; }
jfield() { python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['$1'])"; }

udp_raw() {
    taskset -c 1 "$out/udp_pingpong" srv 127.0.0.1 17877 busy & local s=$!
    sleep 0.3
    taskset -c 0 "$out/udp_pingpong" cli 127.0.0.1 17877 busy 100000
    wait $s
}

for r in $(seq "$REPS"); do
    echo "repetition $r/$REPS" >&2
    v=$("$out/shm_pingpong" 2000000 0 1 2 | num oneway_ns)
    printf 'limit\tshm cache-line ping-pong (layout 2)\tns\t%s\n' "$v" >> "$rec"
    v=$("$Q" bench pingpong --sizes 8 --iters 200000 --format json | jfield latency_us_median)
    printf 'quiver\tshm 8 B one-way (median)\tns\t%s\n' "$(python3 -c "print($v*1000)")" >> "$rec"

    v=$(taskset -c 0 "$out/memcpy_bw" 65536 0 | num GBps)
    printf 'limit\tmemcpy 64 KiB\tMB/s\t%s\n' "$(python3 -c "print($v*1000)")" >> "$rec"
    v=$("$Q" bench bw --sizes 64K --iters 2000 --format json | jfield bandwidth_MBps)
    printf 'quiver\tshm bandwidth 64 KiB\tMB/s\t%s\n' "$v" >> "$rec"

    v=$(udp_raw | num oneway_p50_us)
    printf 'limit\tUDP loopback ping-pong 8 B (busy, p50)\tus\t%s\n' "$v" >> "$rec"
    v=$("$Q" bench pingpong --transport udp --wait spin --sizes 8 --iters 100000 --format json | jfield latency_us_median)
    printf 'quiver\tudp 8 B one-way (median, spin)\tus\t%s\n' "$v" >> "$rec"
done

python3 - "$rec" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, what, unit, v = line.rstrip("\n").split("\t")
    rows.setdefault((who, what, unit), []).append(float(v))
def fmt(vals):
    return f"{statistics.median(vals):.3g} ({min(vals):.3g}-{max(vals):.3g})"
pairs = [
    ("shm 8 B one-way (median)", "shm cache-line ping-pong (layout 2)", "latency"),
    ("shm bandwidth 64 KiB", "memcpy 64 KiB", "bandwidth"),
    ("udp 8 B one-way (median, spin)", "UDP loopback ping-pong 8 B (busy, p50)", "latency"),
]
find = lambda who, what: next((k, v) for k, v in rows.items() if k[0] == who and k[1] == what)
print("| quiver figure | median (min-max) | limit | median (min-max) | ratio of medians | paired ratios per repetition |")
print("|---|---|---|---|---|---|")
for q, l, kind in pairs:
    (qk, qv), (lk, lv) = find("quiver", q), find("limit", l)
    ratio = statistics.median(qv) / statistics.median(lv)
    paired = " ".join(f"{a / b:.2f}" for a, b in zip(qv, lv))
    print(f"| {q} | {fmt(qv)} {qk[2]} | {l} | {fmt(lv)} {lk[2]} | {ratio:.2f} | {paired} |")
EOF
