#!/usr/bin/env bash
# What UDP segmentation offload (send, UDP_SEGMENT) and coalesced receives (UDP_GRO) buy
# quiver's udp transport between two nodes of emulated clusters (MTU 1500): unshaped and
# 1 Gbit/s. For every repetition the four settings of QUIVER_UDP_GSO x QUIVER_UDP_GRO run
# in turn (reversed on even repetitions), rank 0 on node 0 / core 0, rank 1 on node 1 /
# core 1, each timing run under the exclusive lock of /tmp/bench.lock. Prints one table
# per link: median (min-max) over the repetitions.
#
# usage: bash bench/udp-offload.sh          (REPS=3, LINKS="unlimited 1gbit"; root; ~4 min)
set -euo pipefail
REPS=${REPS:-3}
LINKS=${LINKS:-unlimited 1gbit}
root=$(cd "$(dirname "$0")/.." && pwd)
Q=$root/target/release/quiver
[ "$(id -u)" = 0 ] || { echo "bench/udp-offload.sh: needs root (emulated clusters)" >&2; exit 1; }
cargo build --release -q -p quiver-cli --manifest-path "$root/Cargo.toml"
out=$(mktemp /tmp/qv-udp-offload.XXXXXX)
clusters=()
cleanup() { for c in "${clusters[@]}"; do "$Q" cluster down "$c" >/dev/null 2>&1 || true; done; rm -f "$out"; }
trap cleanup EXIT
settings=("off off" "on off" "on on" "off on")
for link in $LINKS; do
    c=qvo$$-${link:0:4}
    "$Q" cluster up "$c" --nodes 2 --link "$link" --mtu 1500 >/dev/null
    clusters+=("$c")
    for rep in $(seq "$REPS"); do
        order=("${settings[@]}")
        [ $((rep % 2)) = 0 ] && order=("${settings[3]}" "${settings[2]}" "${settings[1]}" "${settings[0]}")
        for s in "${order[@]}"; do
            read -r gso gro <<< "$s"
            for args in "bw --sizes 64K,1M,16M --window 16 --iters 60" "pingpong --wait spin --sizes 8,1K,64K --iters 2000"; do
                # shellcheck disable=SC2086
                QUIVER_UDP_GSO=$gso QUIVER_UDP_GRO=$gro flock -x /tmp/bench.lock \
                    "$Q" bench $args --cluster "$c" --transport udp --format json --timeout 300 2>/dev/null |
                    sed -n "s/^{/{\"link\":\"$link\",\"gso\":\"$gso\",\"gro\":\"$gro\",/p" >> "$out"
            done
        done
    done
done
python3 - "$out" "$REPS" <<'PY'
import collections, json, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    o = json.loads(line)
    v = o.get("bandwidth_MBps") or o.get("latency_us_median")
    d[(o["link"], o["bench"], o["size"], o["gso"], o["gro"])].append(v)
settings = [("off", "off"), ("on", "off"), ("on", "on"), ("off", "on")]
links = sorted({k[0] for k in d}, key=lambda l: l != "unlimited")
for link in links:
    print(f"\n### {link}, MTU 1500 (median (min-max) over {sys.argv[2]} repetitions)\n")
    print("| figure | " + " | ".join(f"GSO {g} / GRO {r}" for g, r in settings) + " |")
    print("|---|" + "---|" * len(settings))
    for bench, unit in (("pingpong", "one-way µs"), ("bw", "MB/s")):
        for size in sorted({k[2] for k in d if k[0] == link and k[1] == bench}):
            cells = []
            for g, r in settings:
                v = d.get((link, bench, size, g, r))
                cells.append(f"{statistics.median(v):.4g} ({min(v):.4g}-{max(v):.4g})" if v else "-")
            print(f"| {bench} {size} B ({unit}) | " + " | ".join(cells) + " |")
PY
