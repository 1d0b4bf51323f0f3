#!/usr/bin/env bash
# The udp channel window (QUIVER_WINDOW) against large messages one at a time: tagged
# ping-pong and bandwidth on an unshaped 2-node cluster, bw and bibw on a 1 Gbit/s one
# (where frames in flight queue at the tbf). Windows in turn, REPS rounds; prints one
# line per round and window (PERFORMANCE, "MPI between nodes over udp, and the udp window
# again").
#
# usage: bash bench/udp-window-pingpong.sh     (REPS=3, WINDOWS="128 512 256"; root; ~8 min)
set -euo pipefail
REPS=${REPS:-3}
WINDOWS=${WINDOWS:-128 512 256}
root=$(cd "$(dirname "$0")/.." && pwd)
Q=$root/target/release/quiver
[ "$(id -u)" = 0 ] || { echo "bench/udp-window-pingpong.sh: needs root (emulated clusters)" >&2; exit 1; }
cargo build --release -q -p quiver-cli --manifest-path "$root/Cargo.toml"
U=qvp$$-u
G=qvp$$-g
cleanup() { for c in "$U" "$G"; do "$Q" cluster down "$c" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
"$Q" cluster up "$U" --nodes 2 --mtu 1500 >/dev/null
"$Q" cluster up "$G" --nodes 2 --link 1gbit --mtu 1500 >/dev/null
fig() { python3 -c "import sys,json; print(' '.join('%s:%.1f'%(o['size'],o[sys.argv[1]]) for o in map(json.loads,sys.stdin)))" "$1"; }
for rep in $(seq "$REPS"); do
  for w in $WINDOWS; do
    pp=$(QUIVER_WINDOW=$w "$Q" bench pingpong --api tagged --cluster "$U" --transport udp --sizes 64K,1M,4M --iters 200 --format json 2>/dev/null | grep '^{' | fig latency_us_median)
    bw=$(QUIVER_WINDOW=$w "$Q" bench bw --api tagged --cluster "$U" --transport udp --sizes 64K,1M,16M --window 16 --iters 20 --format json 2>/dev/null | grep '^{' | fig bandwidth_MBps)
    gbw=$(QUIVER_WINDOW=$w "$Q" bench bw --cluster "$G" --transport udp --sizes 1M --window 16 --iters 20 --format json 2>/dev/null | grep '^{' | fig bandwidth_MBps)
    gbibw=$(QUIVER_WINDOW=$w "$Q" bench bibw --cluster "$G" --transport udp --sizes 1M --window 16 --iters 20 --format json 2>/dev/null | grep '^{' | fig bandwidth_MBps)
    echo "round $rep window $w | ping-pong us $pp | bw MB/s $bw | 1 Gbit/s bw $gbw | 1 Gbit/s bibw $gbibw"
  done
done
