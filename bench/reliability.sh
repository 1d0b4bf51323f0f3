#!/usr/bin/env bash
# The reliability issue's figures over UDP, in one run: latency of none / host / offload
# at 8 B (alternating, paired), goodput of 1 MiB messages under injected loss for host
# and offload, and the LogP table of every scheme (offload twice: engine sharing its
# rank's core, and rank 0's engine on the other core with QUIVER_OFFLOAD_CPU=1).
#
# usage: bash bench/reliability.sh        (REPS=3 by default; ~5 minutes)
# Raw records: target/bench-reliability/records.tsv
set -euo pipefail
REPS=${REPS:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/bench-reliability
mkdir -p "$out"
cd "$root"
cargo build --release -q -p quiver-cli
Q=$root/target/release/quiver
rec=$out/records.tsv
: > "$rec"
field() { python3 -c "import json,sys
for line in sys.stdin:
    line=line.strip()
    if line.startswith('{'): print(json.loads(line)['$1']); break"; }

for r in $(seq "$REPS"); do
    echo "repetition $r/$REPS: latency" >&2
    for m in none host offload; do
        v=$("$Q" bench pingpong --transport udp --reliability $m --sizes 8 --iters 50000 --format json | field latency_us_median)
        printf 'latency\t%s\t%s\n' "$m" "$v" >> "$rec"
    done
    echo "repetition $r/$REPS: goodput" >&2
    for m in host offload; do
        for loss in 0 0.001 0.01 0.05; do
            v=$(QUIVER_FAULTS="loss=$loss,seed=$r" "$Q" bench bw --transport udp --reliability $m --sizes 1M --iters 30 --format json | field bandwidth_MBps)
            printf 'goodput\t%s loss=%s\t%s\n' "$m" "$loss" "$v" >> "$rec"
        done
    done
    echo "repetition $r/$REPS: logp" >&2
    for m in none host offload; do
        line=$("$Q" bench logp --transport udp --reliability $m --sizes 8 --format json | grep '^{')
        printf 'logp\t%s\t%s\n' "$m" "$line" >> "$rec"
    done
    line=$(QUIVER_OFFLOAD_CPU=1 "$Q" bench logp --transport udp --reliability offload --sizes 8 --format json | grep '^{')
    printf 'logp\toffload, engine of rank 0 on core 1\t%s\n' "$line" >> "$rec"
done

python3 - "$rec" <<'EOF'
import json, statistics, sys
lat, good, logp = {}, {}, {}
for line in open(sys.argv[1]):
    kind, key, v = line.rstrip("\n").split("\t")
    if kind == "latency":
        lat.setdefault(key, []).append(float(v))
    elif kind == "goodput":
        good.setdefault(key, []).append(float(v))
    else:
        logp.setdefault(key, []).append(json.loads(v))
def f(vals, d=2):
    # L is left out of a run where it is not separable (quiver bench logp says why):
    # a median over the runs where it was would lean upwards, so any such run makes
    # the cell n/s.
    if any(v is None for v in vals):
        return f"n/s ({sum(v is None for v in vals)}/{len(vals)} runs)"
    return f"{statistics.median(vals):.{d}f} ({min(vals):.{d}f}-{max(vals):.{d}f})"
print("## 8 B one-way latency over udp (median of medians, us), and paired ratio to none")
for m, vals in lat.items():
    ratios = [v / n for v, n in zip(vals, lat["none"])]
    print(f"| {m} | {f(vals)} | {f(ratios)} |")
print("\n## goodput of 1 MiB messages (MB/s), and relative to the same scheme loss-free")
for key, vals in good.items():
    m = key.split()[0]
    base = statistics.median(good[f"{m} loss=0"])
    print(f"| {key} | {f(vals, 0)} | {statistics.median(vals) / base:.2f} |")
print("\n## LogP (us): o_s o_r g L latency")
for key, runs in logp.items():
    cols = [f([r.get(k) for r in runs]) for k in ("o_s_us", "o_r_us", "g_us", "L_us", "latency_us")]
    print(f"| {key} | " + " | ".join(cols) + " |")
EOF
