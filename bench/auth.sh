#!/usr/bin/env bash
# What authenticated frames (QUIVER_AUTH=on: a 16-byte BLAKE3 keyed MAC on every
# datagram, checked on receipt) cost beside the default (off), in the same run: udp on
# loopback, and udp and eth between the two nodes of an unshaped emulated cluster
# (MTU 1500). For every repetition both settings run in turn (swapped on even
# repetitions), rank 0 on core 0, rank 1 on core 1, under the exclusive lock of
# /tmp/bench.lock. Prints median (min-max) over the repetitions and the ratio on/off.
#
# usage: bash bench/auth.sh        (REPS=3; root for the cluster; ~4 min)
set -euo pipefail
REPS=${REPS:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
Q=$root/target/release/quiver
[ "$(id -u)" = 0 ] || { echo "bench/auth.sh: needs root (emulated cluster)" >&2; exit 1; }
cargo build --release -q -p quiver-cli --manifest-path "$root/Cargo.toml"
out=$(mktemp /tmp/qv-auth.XXXXXX)
c=qva$$
cleanup() { "$Q" cluster down "$c" >/dev/null 2>&1 || true; rm -f "$out"; }
trap cleanup EXIT
"$Q" cluster up "$c" --nodes 2 --link unlimited --mtu 1500 >/dev/null
# where: label, then the options that say where the ranks run and over what.
places=("loopback-udp|--transport udp" "cluster-udp|--cluster $c --transport udp" "cluster-eth|--cluster $c --transport eth")
for rep in $(seq "$REPS"); do
    order=(off on)
    [ $((rep % 2)) = 0 ] && order=(on off)
    for place in "${places[@]}"; do
        label=${place%%|*}
        where=${place#*|}
        for auth in "${order[@]}"; do
            for args in "pingpong --wait spin --sizes 8,1K,64K,1M --iters 2000" "bw --sizes 64K,1M --window 16 --iters 60"; do
                # shellcheck disable=SC2086
                QUIVER_AUTH=$auth flock -x /tmp/bench.lock \
                    "$Q" bench $args $where --format json --timeout 300 2>/dev/null |
                    sed -n "s/^{/{\"place\":\"$label\",\"auth\":\"$auth\",/p" >> "$out"
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
    d[(o["place"], o["bench"], o["size"], o["auth"])].append(v)
print(f"median (min-max) over {sys.argv[2]} repetitions\n")
print("| where | figure | QUIVER_AUTH=off | QUIVER_AUTH=on | on / off |")
print("|---|---|---|---|---|")
for place in ("loopback-udp", "cluster-udp", "cluster-eth"):
    for bench, unit in (("pingpong", "one-way µs"), ("bw", "MB/s")):
        for size in sorted({k[2] for k in d if k[0] == place and k[1] == bench}):
            off, on = d.get((place, bench, size, "off")), d.get((place, bench, size, "on"))
            if not off or not on:
                continue
            cell = lambda v: f"{statistics.median(v):.4g} ({min(v):.4g}-{max(v):.4g})"
            ratio = statistics.median(on) / statistics.median(off)
            print(f"| {place} | {bench} {size} B ({unit}) | {cell(off)} | {cell(on)} | {ratio:.2f} |")
PY
