#!/usr/bin/env bash
# Where an emulated 1 Gbit/s link loses time: traces the qdisc enqueue/dequeue events
# (tracefs) of every tbf of a 2-node cluster while `quiver bench` runs, and splits the
# idle time of each tbf's virtual wire into time when a frame was waiting in the tbf
# (the kernel woke tbf late: an artifact of emulating the link in software) and time
# when nothing was waiting (the sender left the link idle). The node's tbf is the
# sender's link; its switch port mirrors it. Prints one block per run.
#
# usage: bash bench/tbf-trace.sh ["bibw eth" "bw udp" ...]   (root; ~10 s per run)
#        LINK=1gbit (default) or 100mbit
#        SINGLE_BUCKET=1: replace every tbf with the one-bucket shaping quiver used until
#        2026-11-22 (burst = the peak bucket, no peak rate), to compare
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
Q=$root/target/release/quiver
T=/sys/kernel/tracing
[ "$(id -u)" = 0 ] || { echo "bench/tbf-trace.sh: needs root" >&2; exit 1; }
[ -w $T/trace ] || { echo "bench/tbf-trace.sh: needs tracefs at $T" >&2; exit 1; }
cargo build --release -q -p quiver-cli --manifest-path "$root/Cargo.toml"
[ $# -gt 0 ] || set -- "bw eth" "bibw eth" "bw udp"
c=qvt$$
trace=$(mktemp /tmp/qv-tbf-trace.XXXXXX)
events=(qdisc/qdisc_enqueue qdisc/qdisc_dequeue net/net_dev_queue)
tracing() { for e in "${events[@]}"; do echo "$1" > "$T/events/$e/enable"; done; echo "$1" > $T/tracing_on; }
cleanup() { tracing 0 2>/dev/null || true; "$Q" cluster down "$c" >/dev/null 2>&1 || true; rm -f "$trace"; }
trap cleanup EXIT
"$Q" cluster up "$c" --nodes 2 --link "${LINK:-1gbit}" --mtu 1500 >/dev/null
if [ "${SINGLE_BUCKET:-0}" = 1 ]; then
    read -r rate minburst limit < <("$Q" cluster list --format json | python3 -c "
import json, sys
t = next(x for x in json.load(sys.stdin) if x['name'] == '$c')['tbf']
print(t['rate_bps'], t['minburst'] or t['burst'], t['limit'])")
    for dev in "qv-$c-n0 qv0" "qv-$c-n1 qv0" "qv-$c-sw p0" "qv-$c-sw p1"; do
        read -r ns d <<< "$dev"
        ip netns exec "$ns" tc qdisc replace dev "$d" root tbf rate "${rate}bit" burst "$minburst" limit "$limit"
    done
fi
ip netns exec "qv-$c-n0" tc qdisc show dev qv0
old_kb=$(cat $T/buffer_size_kb)
echo 16384 > $T/buffer_size_kb
for run in "$@"; do
    read -r bench transport <<< "$run"
    echo > $T/trace
    # Tracing from the start (switching it on mid-run recorded nothing here); the ring
    # overwrites, so what is read after 4 s is the last few hundred milliseconds.
    tracing 1
    "$Q" bench "$bench" --cluster "$c" --transport "$transport" --sizes 1048576 --window 16 \
        --iters 40 --format csv 2>/dev/null | tail -1 | cut -d, -f13 > "$trace.bw" &
    sleep 4
    echo 0 > $T/tracing_on
    wait
    tracing 0
    cat $T/trace > "$trace"
    echo "== quiver bench $bench --transport $transport --sizes 1048576: $(cat "$trace.bw") MB/s (the whole run)"
    python3 "$root/bench/cluster/tbf_idle.py" "$trace" "${LINK:-1gbit}"
done
echo "$old_kb" > $T/buffer_size_kb
rm -f "$trace.bw"
