#!/usr/bin/env bash
# Goodput under real packet loss (issue 31): 1 MiB messages between the two nodes of
# emulated clusters whose switch drops frames (`quiver cluster up --loss`, nftables),
# against the same benchmark on a loss-free cluster of the same link, in one run:
# `quiver bench bw --cluster C --transport T --reliability M --sizes 1M` for T in udp,
# eth and M in host, offload; and a kernel TCP stream (iperf3, 2 s) on the same
# clusters. Clusters of every loss rate are up at once and the runs alternate between
# them within each repetition, so the machine's drift hits every rate alike. Prints,
# per configuration, the median goodput of each loss rate and the median of the paired
# ratios to the loss-free run of the same repetition. Every cluster is removed at exit.
#
# usage: bash bench/loss.sh                      (REPS=3, LOSSES="1 5", LINK=unlimited)
#        LINK=1gbit REPS=5 bash bench/loss.sh
# Raw records: target/bench-loss/records.tsv (link, config, loss %, rep, MB/s)
set -euo pipefail
REPS=${REPS:-3}
LOSSES=${LOSSES:-1 5}
LINK=${LINK:-unlimited}
TRANSPORTS=${TRANSPORTS:-udp eth}
SCHEMES=${SCHEMES:-host offload}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/bench-loss
mkdir -p "$out"
cd "$root"
source bench/lib.sh
die() { echo "bench/loss.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (emulated clusters)"
command -v iperf3 >/dev/null || die "iperf3 is missing (apt-get install iperf3)"
building cargo build --release -q -p quiver-cli || die "build failed"
Q=$root/target/release/quiver
rec=$out/records.tsv
: > "$rec"
clusters=()
cleanup() { for c in "${clusters[@]}"; do "$Q" cluster down "$c" >/dev/null 2>&1; done; true; }
trap cleanup EXIT INT TERM

for loss in 0 $LOSSES; do
    c=qvloss$$-$loss
    "$Q" cluster up "$c" --nodes 2 --link "$LINK" --loss "$loss%" >/dev/null || die "cluster up $c failed"
    clusters+=("$c")
done

quiver_bw() {   # quiver_bw CLUSTER TRANSPORT SCHEME
    locked "$Q" bench bw --cluster "$1" --transport "$2" --reliability "$3" --sizes 1M \
        --format json 2>/dev/null | grep '^{' |
        python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["bandwidth_MBps"])'
}

tcp_bw() {   # tcp_bw CLUSTER: a kernel TCP stream from node 0 to node 1, MB/s
    local c=$1 addr
    addr=$(ip -n "qv-$c-n1" -4 -o addr show qv0 | awk '{print $4}' | cut -d/ -f1)
    ip netns exec "qv-$c-n1" iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
    local server=$!
    sleep 0.3
    locked ip netns exec "qv-$c-n0" taskset -c 0 iperf3 -c "$addr" -p 5299 -t 2 -J 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e6)'
    wait "$server" 2>/dev/null || true
}

for rep in $(seq "$REPS"); do
    echo "repetition $rep/$REPS" >&2
    for loss in 0 $LOSSES; do
        c=qvloss$$-$loss
        for tr in $TRANSPORTS; do
            for m in $SCHEMES; do
                printf '%s\t%s\t%s\t%s\t%s\n' "$LINK" "quiver $tr $m" "$loss" "$rep" \
                    "$(quiver_bw "$c" "$tr" "$m" || echo nan)" >> "$rec"
            done
        done
        printf '%s\t%s\t%s\t%s\t%s\n' "$LINK" "kernel TCP (iperf3)" "$loss" "$rep" \
            "$(tcp_bw "$c" || echo nan)" >> "$rec"
    done
done

python3 - "$rec" $LOSSES <<'EOF'
import math, statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    link, cfg, loss, rep, v = line.rstrip("\n").split("\t")
    rows.setdefault((cfg, loss), {})[rep] = float(v)
losses = sys.argv[2:]
link = open(sys.argv[1]).readline().split("\t")[0]
print(f"link {link}; MB/s (10^6 B/s), median over repetitions; ratio: median of the "
      "per-repetition ratios to the loss-free run")
print("| configuration | loss-free | " + " | ".join(f"{l} % loss | ratio" for l in losses) + " |")
print("|---" * (2 + 2 * len(losses)) + "|")
for cfg in dict.fromkeys(c for c, _ in rows):
    base = rows[(cfg, "0")]
    cells = [f"{st.median(base.values()):.0f}"]
    for l in losses:
        got = rows.get((cfg, l), {})
        ratios = [got[r] / base[r] for r in got if r in base and base[r] > 0
                  and not math.isnan(got[r])]
        cells.append(f"{st.median(got.values()):.0f}")
        cells.append(f"{st.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                     if ratios else "-")
    print(f"| {cfg} | " + " | ".join(cells) + " |")
EOF
