#!/usr/bin/env bash
# Goodput under real packet loss (issue 31): 1 MiB messages between the two nodes of
# emulated clusters whose switch drops frames (`quiver cluster up --loss`, nftables),
# against the same benchmark on a loss-free cluster of the same link, in one run:
# `quiver bench bw --cluster C --transport T --reliability M --sizes 1M` for T in udp,
# eth and M in host, offload; a kernel TCP stream (iperf3, 2 s) and Open MPI over TCP
# (ob1/tcp, bench/progs/osu_mpi.c bw at 1 MiB, 2 s; mpirun runs in a management
# namespace joined to both nodes, as in bench/bcast.sh) on the same clusters. Clusters of every loss rate are up at once and the runs alternate between
# them within each repetition, so the machine's drift hits every rate alike. Prints,
# per configuration, the median goodput of each loss rate and the median of the paired
# ratios to the loss-free run of the same repetition. Every cluster is removed at exit.
#
# The loss of 0.0001 % (one frame in a million) measures the cost of the nftables rule
# itself: the emulated switch evaluates it for every frame on the sending rank's core
# (a real switch's loss costs the hosts nothing), and it cost eth 7-8 % of its
# loss-free goodput (session 30).
#
# usage: bash bench/loss.sh                      (REPS=3, LOSSES="0.0001 1 5",
#                                                 LINK=unlimited; about 4 minutes)
#        LINK=1gbit REPS=5 bash bench/loss.sh
#        MTU=9000 bash bench/loss.sh              (jumbo frames on every interface)
# Raw records: target/bench-loss/records.tsv (link, config, loss %, rep, MB/s)
set -euo pipefail
REPS=${REPS:-3}
LOSSES=${LOSSES:-0.0001 1 5}
LINK=${LINK:-unlimited}
MTU=${MTU:-1500}
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
command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null \
    || die "needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
building cargo build --release -q -p quiver-cli || die "build failed"
mpicc.openmpi -O2 -o "$out/osu_mpi" bench/progs/osu_mpi.c || die "mpicc failed"
Q=$root/target/release/quiver
rec=$out/records.tsv
: > "$rec"
clusters=()
cleanup() {
    for c in "${clusters[@]}"; do
        ip netns del "mg-$c" 2>/dev/null
        "$Q" cluster down "$c" >/dev/null 2>&1
    done
    true
}
trap cleanup EXIT INT TERM

# mgmt_up CLUSTER I: namespace mg-CLUSTER with a veth to each node k
# (10.(80+I).(k+1).0/24), through which mpirun reaches its daemons: their control
# traffic stays off the lossy switch.
mgmt_up() {
    local c=$1 i=$2 k mg=mg-$1
    ip netns add "$mg" && ip -n "$mg" link set lo up || die "management namespace"
    for k in 0 1; do
        local ns=qv-$c-n$k net=10.$((80 + i)).$((k + 1))
        ip link add "qvlm$k" netns "$mg" type veth peer name qvlm netns "$ns" &&
        ip -n "$mg" addr add "$net.1/24" dev "qvlm$k" && ip -n "$mg" link set "qvlm$k" up &&
        ip -n "$ns" addr add "$net.2/24" dev qvlm && ip -n "$ns" link set qvlm up &&
        ip -n "$ns" route add "10.$((80 + i)).0.0/16" via "$net.1" || die "management veth to $ns"
    done
}

declare -A cluster_of
i=0
for loss in 0 $LOSSES; do
    c=qvloss$$-$i
    cluster_of[$loss]=$c
    "$Q" cluster up "$c" --nodes 2 --link "$LINK" --mtu "$MTU" --loss "$loss%" >/dev/null ||
        die "cluster up $c failed"
    clusters+=("$c")
    mgmt_up "$c" "$i"
    i=$((i + 1))
done
sleep 0.5

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

mpi_bw() {   # mpi_bw CLUSTER I: Open MPI (ob1/tcp over the cluster's switch), MB/s
    local c=$1 i=$2 subnet
    subnet=$(ip -n "qv-$c-n0" -4 -o addr show qv0 | awk '{print $4}' | head -1)
    subnet=$(python3 -c "import ipaddress,sys; print(ipaddress.ip_interface(sys.argv[1]).network)" "$subnet")
    locked timeout 300 ip netns exec "mg-$c" env PMIX_MCA_ptl_tcp_remote_connections=1 \
        PMIX_MCA_ptl_tcp_if_include="10.$((80 + i)).1.0/24" mpirun.openmpi --allow-run-as-root \
        --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include "$subnet" \
        -n 1 ip netns exec "qv-$c-n0" taskset -c 0 "$out/osu_mpi" bw 1048576 2 8388608 : \
        -n 1 ip netns exec "qv-$c-n1" taskset -c 1 "$out/osu_mpi" bw 1048576 2 8388608 2>/dev/null |
        sed -n 's/.*MBps=\([0-9.]*\).*/\1/p' | head -1
}

for rep in $(seq "$REPS"); do
    echo "repetition $rep/$REPS" >&2
    i=0
    for loss in 0 $LOSSES; do
        c=${cluster_of[$loss]}
        for tr in $TRANSPORTS; do
            for m in $SCHEMES; do
                printf '%s\t%s\t%s\t%s\t%s\n' "$LINK" "quiver $tr $m" "$loss" "$rep" \
                    "$(quiver_bw "$c" "$tr" "$m" || echo nan)" >> "$rec"
            done
        done
        printf '%s\t%s\t%s\t%s\t%s\n' "$LINK" "kernel TCP (iperf3)" "$loss" "$rep" \
            "$(tcp_bw "$c" || echo nan)" >> "$rec"
        v=$(mpi_bw "$c" "$i" || true)
        printf '%s\t%s\t%s\t%s\t%s\n' "$LINK" "Open MPI (ob1/tcp)" "$loss" "$rep" "${v:-nan}" >> "$rec"
        i=$((i + 1))
    done
done

python3 - "$rec" $LOSSES "$MTU" <<'EOF'
import math, statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    link, cfg, loss, rep, v = line.rstrip("\n").split("\t")
    if v != "nan":
        rows.setdefault((cfg, loss), {})[rep] = float(v)
losses = sys.argv[2:-1]
link = open(sys.argv[1]).readline().split("\t")[0]
print(f"link {link}, MTU {sys.argv[-1]}; MB/s (10^6 B/s), median over repetitions; ratio: median of the "
      "per-repetition ratios to the loss-free run")
print("| configuration | loss-free | " + " | ".join(f"{l} % loss | ratio" for l in losses) + " |")
print("|---" * (2 + 2 * len(losses)) + "|")
for cfg in dict.fromkeys(c for c, _ in rows):
    base = rows.get((cfg, "0"), {})
    cells = [f"{st.median(base.values()):.0f}" if base else "-"]
    for l in losses:
        got = rows.get((cfg, l), {})
        ratios = [got[r] / base[r] for r in got if r in base and base[r] > 0
                  and not math.isnan(got[r])]
        cells.append(f"{st.median(got.values()):.0f}" if got else "-")
        cells.append(f"{st.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                     if ratios else "-")
    print(f"| {cfg} | " + " | ".join(cells) + " |")
EOF
