#!/usr/bin/env bash
# What an emulated 1 Gbit/s link (tbf, MTU 1500) gives the simplest raw Ethernet stream,
# beside quiver eth on the same link: the anchor for "within 1 % of the payload limit".
# Per repetition, in turn, each timing run under the exclusive lock of /tmp/bench.lock,
# senders on node 0 / core 0, receivers on node 1 / core 1:
#   - raw: bench/progs/afpacket_blast, blocking 1514-byte sendto with a 200 kB send
#     buffer for 3 s (rate: frames sent over the sender's own time; the receiving
#     interface must count as many), received by a busy-polled TPACKET_V2 ring;
#   - quiver eth: `quiver bench bw --sizes 16M --window 1 --wait spin`;
# and once: bench/progs/timer_rearm on core 0 (what a tbf watchdog re-arm costs here).
# Prints MB/s of payload and % of each one's payload limit (raw: 1500 B per 1514 B frame;
# quiver eth: 1464 B), median (min-max) over the repetitions.
#
# usage: bash bench/link-probe.sh        (REPS=3; root; ~1 min)
#        LINK=unlimited bash bench/link-probe.sh   (another --link of quiver cluster up:
#        100mbit, 1gbit, 10gbit or unlimited; unlimited has no payload limit to compare with)
set -euo pipefail
REPS=${REPS:-3}
LINK=${LINK:-1gbit}
root=$(cd "$(dirname "$0")/.." && pwd)
Q=$root/target/release/quiver
[ "$(id -u)" = 0 ] || { echo "bench/link-probe.sh: needs root (emulated clusters)" >&2; exit 1; }
cargo build --release -q -p quiver-cli --manifest-path "$root/Cargo.toml"
bin=$root/target/probes
mkdir -p "$bin"
for p in afpacket_blast timer_rearm; do
    gcc -O2 -Wall -Wextra -o "$bin/$p" "$root/bench/progs/$p.c"
done
c=qvl$$
out=$(mktemp /tmp/qv-link-probe.XXXXXX)
cleanup() { "$Q" cluster down "$c" >/dev/null 2>&1 || true; rm -f "$out"; }
trap cleanup EXIT
"$Q" cluster up "$c" --nodes 2 --link "$LINK" --mtu 1500 >/dev/null
n0=qv-$c-n0 n1=qv-$c-n1
mac1=$("$Q" cluster list --format json | python3 -c "
import json, sys
for c in json.load(sys.stdin):
    if c['name'] == '$c':
        print(c['nodes'][1]['mac'])")
for rep in $(seq "$REPS"); do
    flock -x /tmp/bench.lock bash -c "
        ip netns exec $n1 $bin/afpacket_blast recv qv0 4 1 >/dev/null & sleep 0.5
        a=\$(ip netns exec $n1 cat /sys/class/net/qv0/statistics/rx_packets)
        sent=\$(ip netns exec $n0 $bin/afpacket_blast send qv0 $mac1 200000 3 0)
        sleep 0.1
        b=\$(ip netns exec $n1 cat /sys/class/net/qv0/statistics/rx_packets)
        wait
        set -- \$sent
        [ \$((b - a)) -ge \$2 ] || echo \"raw stream: sent \$2 frames, \$((b - a)) arrived\" >&2
        python3 -c \"print('raw', int(\$2 * 1500 / \$8))\"" >> "$out"
    flock -x /tmp/bench.lock "$Q" bench bw --cluster "$c" --transport eth --wait spin \
        --sizes 16777216 --window 1 --iters 20 --format csv --timeout 300 2>/dev/null |
        awk -F, 'NR == 2 { printf "eth %d\n", $13 * 1e6 }' >> "$out"
done
echo "## timer re-arm cost (core 0)"
flock -x /tmp/bench.lock "$bin/timer_rearm" 0
python3 - "$out" "$REPS" "$LINK" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    k, v = line.split()
    d[k].append(int(v) / 1e6)
link = {"100mbit": 12.5, "1gbit": 125.0, "10gbit": 1250.0}.get(sys.argv[3])
limits = {"raw": link and link * 1500 / 1514, "eth": link and link * 1464 / 1514}
names = {"raw": "raw AF_PACKET stream (afpacket_blast)", "eth": "quiver eth (bench bw 16 MiB)"}
print(f"\n## {sys.argv[3]}, MTU 1500: median (min-max) over {sys.argv[2]} repetitions\n")
print("| stream | MB/s of payload | payload limit | % of limit |")
print("|---|---|---|---|")
for k in ("raw", "eth"):
    v = d[k]
    if not limits[k]:
        print(f"| {names[k]} | {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}) | - | - |")
        continue
    pct = [100 * x / limits[k] for x in v]
    print(f"| {names[k]} | {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}) | {limits[k]:.3f} "
          f"| {statistics.median(pct):.2f} ({min(pct):.2f}-{max(pct):.2f}) |")
PY
