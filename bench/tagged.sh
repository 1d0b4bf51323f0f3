#!/usr/bin/env bash
# The Push-Pull issue's figures in one run, inside the node:
#  - tagged bandwidth at 1 MiB and 16 MiB beside process_vm_readv (limits/cma_bw),
#    Open MPI (mpi/pingpong.c, vader + CMA) and UCX (ucx_perftest tag_bw,
#    UCX_TLS=posix,cma,self), alternating, REPS repetitions, paired ratios;
#  - single-trip latency against size for Push-Zero, Push-All and Push-Pull (Figure 3);
#  - the early- and late-receiver tests (Figure 6), with Push-Pull / Push-All per size;
#  - tagged bandwidth against size (Push-Pull).
# Every pair of processes is pinned to cores 0 and 1.
#
# usage: bash bench/tagged.sh        (REPS=3 by default; ~6 minutes)
# Raw records: target/bench-tagged/records.tsv
set -euo pipefail
REPS=${REPS:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
anchors=${ANCHORS:-$root/../shared/bench/anchors}
out=$root/target/bench-tagged
mkdir -p "$out"
cd "$root"
[ -d "$anchors/limits" ] || { echo "bench/tagged.sh: anchors not found at $anchors (set ANCHORS=DIR)" >&2; exit 1; }
gcc -O2 -Wall -o "$out/cma_bw" "$anchors/limits/cma_bw.c"
have_mpi=0; have_ucx=0
if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
    mpicc.openmpi -O2 -o "$out/pp_ompi" "$anchors/mpi/pingpong.c" && have_mpi=1
fi
command -v ucx_perftest >/dev/null && have_ucx=1
cargo build --release -q -p quiver-cli
Q=$root/target/release/quiver
rec=$out/records.tsv
: > "$rec"
num() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -1; }
jlines() { grep '^{' || true; }

ucx_bw() {   # SIZE -> MB/s
    env UCX_TLS=posix,cma,self taskset -c 1 timeout 120 ucx_perftest -p 13411 >/dev/null 2>&1 & local s=$!
    sleep 0.5
    local n; n=$([ "$1" -ge 16777216 ] && echo 200 || echo 2000)
    env UCX_TLS=posix,cma,self taskset -c 0 timeout 120 ucx_perftest 127.0.0.1 -p 13411 -t tag_bw -s "$1" -n "$n" -f -v 2>&1 \
        | tail -1 | awk -F, 'NF == 8 && $6 + 0 > 0 {printf "%.1f\n", $6 * 1.048576}'
    wait $s || true
}

for r in $(seq "$REPS"); do
    echo "repetition $r/$REPS: bandwidth" >&2
    for size in 1048576 16777216; do
        v=$("$out/cma_bw" $size 0 1 | num GBps)
        printf 'bw\t%s\tprocess_vm_readv\t%s\n' $size "$(python3 -c "print($v*1000)")" >> "$rec"
        v=$("$Q" bench bw --api tagged --sizes $size --format json | jlines | python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['bandwidth_MBps'])")
        printf 'bw\t%s\tquiver tagged (push-pull)\t%s\n' $size "$v" >> "$rec"
        if [ $have_mpi = 1 ]; then
            v=$(mpirun.openmpi --allow-run-as-root -n 2 --bind-to core --map-by core "$out/pp_ompi" -t bw -m $size -x $size 2>/dev/null | awk '$1 == "bw" {print $3}' | head -1)
            [ -n "$v" ] && printf 'bw\t%s\tOpen MPI (vader, CMA)\t%s\n' $size "$v" >> "$rec"
        fi
        if [ $have_ucx = 1 ]; then
            v=$(ucx_bw $size)
            [ -n "$v" ] && printf 'bw\t%s\tUCX tag (posix,cma)\t%s\n' $size "$v" >> "$rec"
        fi
    done
    echo "repetition $r/$REPS: latency by push mode" >&2
    for m in zero all pull; do
        "$Q" bench pingpong --api tagged --push $m --sizes 0,64,256,1K,4K,8K,16K,64K,256K,1M --format json | jlines \
            | python3 -c "
import json, sys
for line in sys.stdin:
    o = json.loads(line)
    print('lat\t%s\t%s\t%s' % (o['size'], '$m', o['latency_us_median']))" >> "$rec"
    done
    echo "repetition $r/$REPS: early and late receivers" >&2
    "$Q" bench early-late --sizes 0,64,256,1K,4K,8K,16K,64K --format json | jlines \
        | python3 -c "
import json, sys
for line in sys.stdin:
    o = json.loads(line)
    print('el\t%s\t%s %s\t%s' % (o['size'], o['receiver'], o['mode'], o['latency_us_median']))" >> "$rec"
done
echo "bandwidth against size" >&2
"$Q" bench bw --api tagged --sizes 1K,4K,16K,64K,256K,1M,4M,16M,64M --format json | jlines \
    | python3 -c "
import json, sys
for line in sys.stdin:
    o = json.loads(line)
    print('curve\t%s\tpull\t%s' % (o['size'], o['bandwidth_MBps']))" >> "$rec"

python3 - "$rec" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kind, size, who, v = line.rstrip("\n").split("\t")
    rows.setdefault((kind, int(size), who), []).append(float(v))
def f(vals, d=1):
    return f"{statistics.median(vals):.{d}f} ({min(vals):.{d}f}-{max(vals):.{d}f})"
def size_name(s):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s >= n and s % n == 0:
            return f"{s // n} {unit}"
    return f"{s} B"
print("## intra-node bandwidth, MB/s: median (min-max); ratio = quiver / anchor, paired per repetition")
for size in (1 << 20, 16 << 20):
    q = rows.get(("bw", size, "quiver tagged (push-pull)"), [])
    for who in ("process_vm_readv", "Open MPI (vader, CMA)", "UCX tag (posix,cma)"):
        a = rows.get(("bw", size, who))
        if not a or not q:
            continue
        ratios = [x / y for x, y in zip(q, a)]
        print(f"| {size_name(size)} | {who} | {f(a, 0)} | quiver {f(q, 0)} | {f(ratios, 2)} |")
print("\n## single-trip latency (us, median of medians) by push mode")
sizes = sorted({k[1] for k in rows if k[0] == "lat"})
print("| size | push-zero | push-all | push-pull |")
for s in sizes:
    cells = [f(rows[("lat", s, m)], 2) if ("lat", s, m) in rows else "-" for m in ("zero", "all", "pull")]
    print(f"| {size_name(s)} | " + " | ".join(cells) + " |")
for rcv in ("early", "late"):
    print(f"\n## {rcv} receiver (us, communication time per iteration, median of medians)")
    sizes = sorted({k[1] for k in rows if k[0] == "el"})
    print("| size | push-zero | push-all | push-pull | pull / all |")
    for s in sizes:
        v = {m: rows.get(("el", s, f"{rcv} {m}")) for m in ("zero", "all", "pull")}
        cells = [f(v[m], 2) if v[m] else "-" for m in ("zero", "all", "pull")]
        ratio = statistics.median(v["pull"]) / statistics.median(v["all"]) if v["pull"] and v["all"] and statistics.median(v["all"]) > 0 else float("nan")
        print(f"| {size_name(s)} | " + " | ".join(cells) + f" | {ratio:.2f} |")
print("\n## tagged bandwidth against size (push-pull, MB/s)")
for (kind, s, who), v in sorted(rows.items()):
    if kind == "curve":
        print(f"| {size_name(s)} | {v[0]:.0f} |")
EOF
