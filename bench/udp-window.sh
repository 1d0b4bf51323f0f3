#!/usr/bin/env bash
# What the channel window (QUIVER_WINDOW, frames in flight per channel) does to quiver's
# udp transport between two nodes of emulated clusters (MTU 1500, segmentation offload
# on, as by default): uni-directional bandwidth on an unshaped link, and on a 100 Mbit/s
# link the frames the sender's tbf dropped and the bytes it put on the wire per payload
# byte (a channel whose first frames time out before the queue ahead of them drains
# sends its window again). For every repetition the windows run in turn (reversed on
# even repetitions), rank 0 on node 0 / core 0, rank 1 on node 1 / core 1, each timing
# run under the exclusive lock of /tmp/bench.lock. Prints median (min-max) over the
# repetitions; "default" is the library's own choice (no QUIVER_WINDOW).
#
# usage: bash bench/udp-window.sh     (REPS=5, WINDOWS="64 default 256"; root; ~4 min)
set -euo pipefail
REPS=${REPS:-5}
WINDOWS=${WINDOWS:-64 default 256}
root=$(cd "$(dirname "$0")/.." && pwd)
Q=$root/target/release/quiver
[ "$(id -u)" = 0 ] || { echo "bench/udp-window.sh: needs root (emulated clusters)" >&2; exit 1; }
cargo build --release -q -p quiver-cli --manifest-path "$root/Cargo.toml"
out=$(mktemp /tmp/qv-udp-window.XXXXXX)
U=qvw$$-u
S=qvw$$-s
cleanup() { for c in "$U" "$S"; do "$Q" cluster down "$c" >/dev/null 2>&1 || true; done; rm -f "$out"; }
trap cleanup EXIT
"$Q" cluster up "$U" --nodes 2 --mtu 1500 >/dev/null
"$Q" cluster up "$S" --nodes 2 --link 100mbit --mtu 1500 >/dev/null
ns0=qv-$S-n0
dropped() { ip netns exec "$ns0" tc -s qdisc show dev qv0 | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1; }
txbytes() { ip netns exec "$ns0" cat /sys/class/net/qv0/statistics/tx_bytes; }
read -ra windows <<< "$WINDOWS"
for rep in $(seq "$REPS"); do
    order=("${windows[@]}")
    if [ $((rep % 2)) = 0 ]; then
        order=()
        for ((i = ${#windows[@]} - 1; i >= 0; i--)); do order+=("${windows[$i]}"); done
    fi
    for w in "${order[@]}"; do
        env=()
        [ "$w" = default ] || env=(QUIVER_WINDOW="$w")
        env "${env[@]}" flock -x /tmp/bench.lock "$Q" bench bw --cluster "$U" --transport udp \
            --sizes 64K,1M,16M --window 64 --iters 64 --format json --timeout 300 2>/dev/null |
            sed -n "s/^{/{\"w\":\"$w\",\"link\":\"unlimited\",/p" >> "$out"
        # 100 Mbit/s: 8 messages of 1 MiB, no warm-up: a fresh channel each run.
        d0=$(dropped) t0=$(txbytes)
        line=$(env "${env[@]}" flock -x /tmp/bench.lock "$Q" bench bw --cluster "$S" --transport udp \
            --sizes 1M --window 4 --iters 4 --warmup 0 --format json --timeout 300 2>/dev/null | grep '^{' | tail -1)
        d1=$(dropped) t1=$(txbytes)
        echo "$line" | sed "s/^{/{\"w\":\"$w\",\"link\":\"100mbit\",\"dropped\":$((d1 - d0)),\"wire\":$((t1 - t0)),/" >> "$out"
    done
done
python3 - "$out" "$REPS" "$WINDOWS" <<'PY'
import collections, json, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    o = json.loads(line)
    w = o["w"]
    if o["link"] == "unlimited":
        d[("bw", o["size"], w)].append(o["bandwidth_MBps"])
    else:
        d[("slow bw", 0, w)].append(o["bandwidth_MBps"])
        d[("dropped", 0, w)].append(o["dropped"])
        # payload: every message of the run (no warm-up); acknowledgements aside
        d[("wire", 0, w)].append(o["wire"] / ((o["iters"] + o["warmup"]) * o["window"] * o["size"]))
windows = sys.argv[3].split()
cell = lambda v: f"{statistics.median(v):.4g} ({min(v):.4g}-{max(v):.4g})" if v else "-"
print(f"\nmedian (min-max) over {sys.argv[2]} repetitions; MB/s = 10^6 B/s\n")
print("| figure | " + " | ".join(f"window {w}" for w in windows) + " |")
print("|---|" + "---|" * len(windows))
for size in sorted({k[1] for k in d if k[0] == "bw"}):
    print(f"| unshaped, bw {size} B (MB/s) | " + " | ".join(cell(d[("bw", size, w)]) for w in windows) + " |")
print("| 100 Mbit/s, bw 1 MiB (MB/s) | " + " | ".join(cell(d[("slow bw", 0, w)]) for w in windows) + " |")
print("| 100 Mbit/s, frames dropped by the sender's tbf | " + " | ".join(cell(d[("dropped", 0, w)]) for w in windows) + " |")
print("| 100 Mbit/s, wire bytes per payload byte (1.051 without resends) | " + " | ".join(cell(d[("wire", 0, w)]) for w in windows) + " |")
PY
