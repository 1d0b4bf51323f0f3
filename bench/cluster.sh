#!/usr/bin/env bash
# The Ethernet figures of the GAMMA and Directed Point papers, on a 2-node emulated cluster
# (`quiver cluster up`), rank 0 / client on node 0 pinned to core 0, rank 1 / server on
# node 1 pinned to core 1, beside the anchors run in the same script on the same links:
#
#   unshaped  --link unlimited, MTU 1500 (and 9000, 65000 for the jumbo-frame rows):
#             a. 8 B one-way latency: quiver eth, quiver udp, raw AF_PACKET ping-pong and raw
#                UDP ping-pong (anchors' limits/*.c, busy-poll) between the same namespaces;
#             b. bandwidth 64 KiB .. 16 MiB of quiver eth and udp against Open MPI (ob1/tcp,
#                anchors' mpi/pingpong.c -t bw) and iperf3 TCP between the same namespaces;
#             c. the same quiver bandwidth with --mtu 9000 and --mtu 65000.
#   100mbit   --link 100mbit: 1 MiB / 16 MiB throughput of quiver eth and udp against the
#             link rate and the payload limit of each frame format; the half-power point by
#             ping-pong (GAMMA Figure 1: one message in flight, throughput = size / one-way
#             time, 8 B .. 64 KiB) of quiver eth, quiver udp and Open MPI (tcp, with
#             cluster/mpi_lat.c: the same sizes and statistics as quiver's ping-pong),
#             and iperf3 TCP on the same link as an anchor of what the emulated link delivers;
#             the same curve and the 1 MiB throughput with GAMMA's ports (--api ports), and
#             the ports' buffered curve (--ports-copy: one extra receive copy).
#   1gbit     --link 1gbit: bw and bibw of quiver eth and udp against the payload limit,
#             beside iperf3 TCP and raw AF_PACKET streams (bench/progs/afpacket_blast, no
#             protocol: one way, and both ways at once) on the same link.
#   gamma     GAMMA's Table 1 on the unshaped cluster: quiver eth, quiver udp, kernel TCP
#             (cluster/tcp_pingpong.c, iperf3) and kernel UDP (limits/udp_pingpong.c,
#             iperf3 -u) sockets: 8 B one-way latency and large-message throughput.
#
# Every measurement is repeated REPS times, systems alternating within a repetition (the
# order is reversed on even repetitions); each timing run holds the exclusive lock on
# /tmp/bench.lock, builds and installs the shared one (as the anchors do). Open MPI's
# mpirun runs in a management namespace joined to each node by an extra veth
# (10.79.1.0/24, 10.79.2.0/24) that carries only its PMIx traffic; MPI data is restricted
# to the cluster's subnet on qv0 (btl_tcp_if_include). Every cluster and namespace made
# here is removed at exit, also on error or Ctrl-C.
#
# usage: bash bench/cluster.sh                  (REPS=5; ~13 minutes: REPS=1 took 2.5 min here)
#        QUICK=1 bash bench/cluster.sh          (REPS=1, fewer iterations: a trial, ~2 min)
#        SCENARIOS="100mbit gamma" REPS=3 bash bench/cluster.sh
# knobs: REPS, QUICK, SCENARIOS ("unshaped 100mbit 1gbit gamma"), OUT (results dir,
#        default target/bench-cluster), ANCHORS (default ../shared/bench/anchors),
#        SKIP_BUILD=1 (use target/release/quiver as it is).
# Results: OUT/tables.md (the tables printed at the end), OUT/records.tsv (one record per
#        run and figure), OUT/raw.log (every command with its output), OUT/commands.tsv,
#        OUT/meta.tsv (the clusters as built).
set -uo pipefail
QUICK=${QUICK:-0}
REPS=${REPS:-$([ "$QUICK" = 1 ] && echo 1 || echo 5)}
SCENARIOS=${SCENARIOS:-unshaped 100mbit 1gbit gamma}
root=$(cd "$(dirname "$0")/.." && pwd)
anchors=$(cd "${ANCHORS:-$root/../shared/bench/anchors}" 2>/dev/null && pwd) || anchors=""
out=${OUT:-$root/target/bench-cluster}
here=$root/bench/cluster
build=$out/build
LOCK=/tmp/bench.lock
Q=$root/target/release/quiver
mkdir -p "$out" "$build"
out=$(cd "$out" && pwd)
cd "$root"

die() { echo "bench/cluster.sh: $*" >&2; exit 1; }
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
has() { case " $SCENARIOS " in *" $1 "*) return 0 ;; esac; return 1; }
for s in $SCENARIOS; do
    case $s in unshaped|100mbit|1gbit|gamma) ;; *) die "unknown scenario '$s' (unshaped 100mbit 1gbit gamma)" ;; esac
done
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, AF_PACKET)"
[ "$(nproc)" -ge 2 ] || die "needs 2 cores (the two processes are pinned to cores 0 and 1)"
[ -n "$anchors" ] && [ -d "$anchors/limits" ] || die "anchors not found (set ANCHORS=DIR)"

# ---- locks and command lines (bench/lib.sh)
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # locked, building, show

# ---- iteration counts (QUICK=1: a trial)
if [ "$QUICK" = 1 ]; then
    LAT_ITERS=20000; BW_BYTES=$((96 << 20)); IPERF_T=2; MPI_T=0.1; BLAST_T=1
    PP_SMALL_ITERS=300; PP_LARGE_ITERS=40; SHAPED_WINDOWS=2
else
    LAT_ITERS=100000; BW_BYTES=$((256 << 20)); IPERF_T=5; MPI_T=0.25; BLAST_T=3
    PP_SMALL_ITERS=1000; PP_LARGE_ITERS=100; SHAPED_WINDOWS=4
fi
QTIMEOUT=300   # --timeout of every quiver bench job, seconds

# ---- build and install
need_pkgs() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    building apt-get install -y -q "${missing[@]}" >/dev/null ||
        { building apt-get update -q >/dev/null && building apt-get install -y -q "${missing[@]}" >/dev/null; }
}
need_pkgs gcc iproute2 util-linux python3 openmpi-bin libopenmpi-dev iperf3 || die "package install failed"
if [ -z "${SKIP_BUILD:-}" ]; then
    log "cargo build --release"
    building cargo build --release -q || die "cargo build --release failed"
fi
[ -x "$Q" ] || die "$Q missing"
building gcc -O2 -Wall -o "$build/afpacket_pingpong" "$anchors/limits/afpacket_pingpong.c" || die "gcc afpacket_pingpong"
building gcc -O2 -Wall -o "$build/afpacket_ring_pp" "$root/bench/progs/afpacket_ring_pp.c" || die "gcc afpacket_ring_pp"
building gcc -O2 -Wall -o "$build/udp_pingpong" "$anchors/limits/udp_pingpong.c" || die "gcc udp_pingpong"
building gcc -O2 -Wall -o "$build/afpacket_blast" "$root/bench/progs/afpacket_blast.c" || die "gcc afpacket_blast"
building gcc -O2 -Wall -o "$build/tcp_pingpong" "$here/tcp_pingpong.c" || die "gcc tcp_pingpong"
building mpicc.openmpi -O2 -Wall -o "$build/pp_ompi" "$anchors/mpi/pingpong.c" || die "mpicc pingpong.c"
building mpicc.openmpi -O2 -Wall -o "$build/mpi_lat" "$here/mpi_lat.c" || die "mpicc mpi_lat.c"
export OMPI_MCA_btl_base_warn_component_unused=0

rec=$out/records.tsv; raw=$out/raw.log; cmds=$out/commands.tsv; meta=$out/meta.tsv
: > "$rec"; : > "$raw"; : > "$cmds"; : > "$meta"
tmp=$(mktemp -d /tmp/qvbench.XXXXXX)

# ---- clusters and the management namespace, all removed at exit
tag=qvb$$                     # unique per run: clusters qvbPID-..., namespace qvbPID-m
MG=$tag-m
clusters=()
cleanup() {
    local c
    ip netns del "$MG" 2>/dev/null
    for c in "${clusters[@]}"; do "$Q" cluster down "$c" >/dev/null 2>&1 || log "cluster down $c failed"; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

declare -A NS0 NS1 IP1 SUBNET MAC0 MAC1
cluster_up() {   # cluster_up NAME ARGS... : builds it and records its facts
    local c=$1; shift
    log "quiver cluster up $c --nodes 2 $*"
    "$Q" cluster up "$c" --nodes 2 "$@" >> "$raw" 2>&1 || die "quiver cluster up $c --nodes 2 $* failed (see $raw)"
    clusters+=("$c")
    "$Q" cluster list --format json > "$tmp/list.json" || die "quiver cluster list failed"
    local facts
    facts=$(python3 - "$c" "$tmp/list.json" "$meta" <<'EOF'
import json, sys
name, path, meta = sys.argv[1:]
c = next(x for x in json.load(open(path)) if x["name"] == name)
n = sorted(c["nodes"], key=lambda x: x["index"])
assert c["complete"] and len(n) == 2 and all(x["ip"] for x in n), c
tbf = c["tbf"] or {}
with open(meta, "a") as f:
    f.write("\t".join(map(str, [name, c["link"], c["mtu"], tbf.get("rate_bps", 0), tbf.get("burst", ""),
                               tbf.get("limit", ""), c["subnet"], n[0]["mac"], n[1]["mac"],
                               tbf.get("peakrate_bps") or 0, tbf.get("minburst") or ""])) + "\n")
print(n[0]["namespace"], n[1]["namespace"], n[1]["ip"], c["subnet"], n[0]["mac"], n[1]["mac"])
EOF
    ) || die "cannot read cluster $c from quiver cluster list"
    read -r NS0[$c] NS1[$c] IP1[$c] SUBNET[$c] MAC0[$c] MAC1[$c] <<< "$facts"
    { echo "== cluster $c"; "$Q" cluster list; ip netns exec "${NS0[$c]}" tc qdisc show dev qv0; } >> "$raw" 2>&1
}
cluster_down() {
    local c=$1 k
    "$Q" cluster down "$c" >> "$raw" 2>&1 || log "quiver cluster down $c failed"
    for k in "${!clusters[@]}"; do [ "${clusters[$k]}" = "$c" ] && unset 'clusters[k]'; done
    clusters=("${clusters[@]}")
}
# mgmt_up CLUSTER: namespace $MG with a veth to each node (10.79.1.0/24 to node 0,
# 10.79.2.0/24 to node 1, routes between them): mpirun's PMIx traffic only.
mgmt_up() {
    local c=$1
    ip netns del "$MG" 2>/dev/null
    ip netns add "$MG" && ip -n "$MG" link set lo up &&
    ip link add qvbm0 netns "$MG" type veth peer name qvbm netns "${NS0[$c]}" &&
    ip link add qvbm1 netns "$MG" type veth peer name qvbm netns "${NS1[$c]}" &&
    ip -n "$MG" addr add 10.79.1.1/24 dev qvbm0 && ip -n "$MG" link set qvbm0 up &&
    ip -n "$MG" addr add 10.79.2.1/24 dev qvbm1 && ip -n "$MG" link set qvbm1 up &&
    ip -n "${NS0[$c]}" addr add 10.79.1.2/24 dev qvbm && ip -n "${NS0[$c]}" link set qvbm up &&
    ip -n "${NS1[$c]}" addr add 10.79.2.2/24 dev qvbm && ip -n "${NS1[$c]}" link set qvbm up &&
    ip -n "${NS0[$c]}" route add 10.79.2.0/24 via 10.79.1.1 &&
    ip -n "${NS1[$c]}" route add 10.79.1.0/24 via 10.79.2.1 || die "management namespace for $c failed"
    sleep 0.5
}
mgmt_down() { ip netns del "$MG" 2>/dev/null; true; }
txb() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_bytes" 2>/dev/null || echo 0; }

# ---- records: scenario, system, metric, size, repetition, value
record() {
    if python3 -c 'import sys; v = float(sys.argv[1]); sys.exit(0 if v == v and v >= 0 else 1)' "$6" 2>/dev/null; then
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$rec"
    else
        log "FAILED measurement, not recorded: $1 / $2 / $3 / $4 B / run $5 (value '$6')"
        printf 'FAILED\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$raw"
    fi
}
note_cmd() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" | sed "s#$root/##g; s#$out/#\$OUT/#g" >> "$cmds"; }

# qbench SCEN SYSTEM REP CLUSTER BENCH ARGS... : `quiver bench BENCH ARGS --cluster C
# --format json`, timed under the lock; one record per result line (pingpong: lat =
# median one-way us, lat_avg80; bw/bibw: MB/s = avg80 of the windows, and the median), and
# "bw_wire"/"bibw_wire": bytes node 0 put on qv0 / payload bytes rank 0 sent in the whole run
# (retransmissions show here; run one size per invocation for it to mean something).
qbench() {
    local scen=$1 sys=$2 rep=$3 c=$4 bench=$5; shift 5
    local cmd=("$Q" bench "$bench" --cluster "$c" "$@" --format json --timeout "$QTIMEOUT")
    note_cmd "$scen" "$sys" "$(show "${cmd[@]}")"
    echo "== $scen | $sys | run $rep: $(show "${cmd[@]}")" >> "$raw"
    local t0 tx0 tx1 rc
    tx0=$(txb "${NS0[$c]}" qv0); t0=$(date +%s.%N)
    locked "${cmd[@]}" > "$tmp/q.out" 2> "$tmp/q.err"; rc=$?
    tx1=$(txb "${NS0[$c]}" qv0)
    cat "$tmp/q.out" "$tmp/q.err" >> "$raw"
    echo "rc=$rc wall_s=$(python3 -c "import time; print(round(time.time() - $t0, 2))") node0_qv0_tx_bytes=$((tx1 - tx0))" >> "$raw"
    [ $rc = 0 ] || log "FAILED ($rc): $scen | $sys | run $rep: $(show "${cmd[@]}"): $(tail -c 300 "$tmp/q.err")"
    python3 - "$scen" "$sys" "$rep" "$((tx1 - tx0))" "$tmp/q.out" >> "$tmp/q.rec" <<'EOF'
import json, sys
scen, system, rep, tx, path = sys.argv[1:]
payload = 0
for line in open(path):
    if not line.startswith("{"):
        continue
    o = json.loads(line)
    b, size = o["bench"], o["size"]
    n = o["iters"] + o["warmup"]
    if b == "pingpong":
        print(scen, system, "lat", size, rep, o["latency_us_median"], sep="\t")
        print(scen, system, "lat_avg80", size, rep, o["latency_us_avg80"], sep="\t")
        payload += size * n
    else:
        print(scen, system, b, size, rep, o["bandwidth_MBps"], sep="\t")
        print(scen, system, b + "_median", size, rep, o["bandwidth_MBps_median"], sep="\t")
        print(scen, system, b + "_window", size, rep, o["window"], sep="\t")
        payload += size * o["window"] * n
        if int(tx) > 0:
            print(scen, system, b + "_wire", size, rep, int(tx) / payload, sep="\t")
EOF
    local line
    while IFS=$'\t' read -r -a line; do record "${line[@]}"; done < "$tmp/q.rec"
    : > "$tmp/q.rec"
    grep -q '^{' "$tmp/q.out" || record "$scen" "$sys" "$bench" 0 "$rep" "failed"
}

# raw ping-pongs between the namespaces (server node 1 / core 1, client node 0 / core 0)
pp_pair() {   # pp_pair SRVCMD... -- CLICMD... : prints the client's line
    local srv=() cli=()
    while [ "$1" != "--" ]; do srv+=("$1"); shift; done; shift; cli=("$@")
    "${srv[@]}" >/dev/null 2>"$tmp/srv.err" & local spid=$!
    sleep 0.3
    "${cli[@]}" 2>&1
    wait $spid 2>/dev/null || true
}
rawpp() {     # rawpp SCEN SYSTEM REP CLUSTER afpacket|afring|udp|tcp
    local scen=$1 sys=$2 rep=$3 c=$4 kind=$5 srv cli
    local n0=(ip netns exec "${NS0[$c]}" taskset -c 0 timeout 120) n1=(ip netns exec "${NS1[$c]}" taskset -c 1 timeout 120)
    case $kind in
        afpacket) srv=("${n1[@]}" "$build/afpacket_pingpong" srv qv0 busy)
                  cli=("${n0[@]}" "$build/afpacket_pingpong" cli qv0 busy "$LAT_ITERS") ;;
        afring)   srv=("${n1[@]}" "$build/afpacket_ring_pp" srv qv0)
                  cli=("${n0[@]}" "$build/afpacket_ring_pp" cli qv0 "$LAT_ITERS") ;;
        udp)      srv=("${n1[@]}" "$build/udp_pingpong" srv "${IP1[$c]}" 17877 busy)
                  cli=("${n0[@]}" "$build/udp_pingpong" cli "${IP1[$c]}" 17877 busy "$LAT_ITERS") ;;
        tcp)      srv=("${n1[@]}" "$build/tcp_pingpong" srv "${IP1[$c]}" 17878 busy)
                  cli=("${n0[@]}" "$build/tcp_pingpong" cli "${IP1[$c]}" 17878 busy "$LAT_ITERS") ;;
    esac
    note_cmd "$scen" "$sys" "$(show "${srv[@]}") & $(show "${cli[@]}")"
    echo "== $scen | $sys | run $rep: $(show "${srv[@]}") & $(show "${cli[@]}")" >> "$raw"
    locked pp_pair "${srv[@]}" -- "${cli[@]}" > "$tmp/pp.out"
    cat "$tmp/pp.out" >> "$raw"
    record "$scen" "$sys" lat 8 "$rep" "$(sed -n 's/.*oneway_p50_us=\([0-9.]*\).*/\1/p' "$tmp/pp.out")"
    record "$scen" "$sys" lat_avg 8 "$rep" "$(sed -n 's/.*oneway_avg_us=\([0-9.]*\).*/\1/p' "$tmp/pp.out")"
}
iperf_pair() {   # iperf_pair C CLIENT_ARGS...
    local c=$1; shift
    ip netns exec "${NS1[$c]}" taskset -c 1 timeout 60 iperf3 -s -1 -p 5311 >/dev/null 2>&1 & local spid=$!
    sleep 0.5
    ip netns exec "${NS0[$c]}" taskset -c 0 timeout 60 iperf3 -c "${IP1[$c]}" -p 5311 -t "$IPERF_T" -J "$@"
    wait $spid 2>/dev/null || true
}
iperf() {      # iperf SCEN SYSTEM REP CLUSTER [-u ...]
    local scen=$1 sys=$2 rep=$3 c=$4; shift 4
    note_cmd "$scen" "$sys" "ip netns exec ${NS1[$c]} taskset -c 1 iperf3 -s -1 -p 5311 & ip netns exec ${NS0[$c]} taskset -c 0 iperf3 -c ${IP1[$c]} -p 5311 -t $IPERF_T -J $*"
    echo "== $scen | $sys | run $rep: iperf3 -c ${IP1[$c]} -t $IPERF_T $*" >> "$raw"
    locked iperf_pair "$c" "$@" > "$tmp/iperf.json" 2>> "$raw"
    local v
    v=$(python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["end"]; r = e["sum_received"]
print("%.3f %.3f" % (r["bits_per_second"] / 8e6, r.get("lost_percent", 0.0)))' "$tmp/iperf.json" 2>/dev/null) ||
        { v="failed failed"; head -c 2000 "$tmp/iperf.json" >> "$raw"; }
    echo "receiver MB/s and loss %: $v" >> "$raw"
    record "$scen" "$sys" stream 0 "$rep" "${v% *}"
    case " $* " in *" -u "*) record "$scen" "$sys" loss_pct 0 "$rep" "${v#* }" ;; esac
}
# raw AF_PACKET streams (bench/progs/afpacket_blast: 1514-byte frames, one blocking sendto
# each, a 200 kB send buffer, no protocol) for BLAST_T s from node 0 / core 0 to node 1,
# and with "bi" from node 1 / core 1 to node 0 at the same time; no program receives
# them. blast_pair prints one line per stream: frames sent, seconds, frames the
# receiving node's qv0 counted.
rx_frames() { ip netns exec "$1" cat /sys/class/net/qv0/statistics/rx_packets 2>/dev/null || echo 0; }
blast_pair() {   # blast_pair C uni|bi
    local c=$1 way=$2 r0 r1 p1=""
    r1=$(rx_frames "${NS1[$c]}"); r0=$(rx_frames "${NS0[$c]}")
    ip netns exec "${NS0[$c]}" "$build/afpacket_blast" send qv0 "${MAC1[$c]}" 200000 "$BLAST_T" 0 > "$tmp/blast0.out" & local p0=$!
    if [ "$way" = bi ]; then
        ip netns exec "${NS1[$c]}" "$build/afpacket_blast" send qv0 "${MAC0[$c]}" 200000 "$BLAST_T" 1 > "$tmp/blast1.out" & p1=$!
    fi
    wait $p0 $p1
    sleep 0.1
    set -- $(cat "$tmp/blast0.out"); echo "$2 $8 $(( $(rx_frames "${NS1[$c]}") - r1 ))"
    if [ "$way" = bi ]; then set -- $(cat "$tmp/blast1.out"); echo "$2 $8 $(( $(rx_frames "${NS0[$c]}") - r0 ))"; fi
}
blast() {      # blast SCEN SYSTEM REP CLUSTER uni|bi : records bw (uni) or bibw (bi), MB/s of payload
    local scen=$1 sys=$2 rep=$3 c=$4 way=$5 test=bw
    [ "$way" = bi ] && test=bibw
    local cmd="ip netns exec ${NS0[$c]} $build/afpacket_blast send qv0 ${MAC1[$c]} 200000 $BLAST_T 0"
    [ "$way" = bi ] && cmd+=" & ip netns exec ${NS1[$c]} $build/afpacket_blast send qv0 ${MAC0[$c]} 200000 $BLAST_T 1"
    note_cmd "$scen" "$sys" "$cmd"
    echo "== $scen | $sys | run $rep: $cmd" >> "$raw"
    locked blast_pair "$c" "$way" > "$tmp/blast.out" 2>> "$raw"
    cat "$tmp/blast.out" >> "$raw"
    # Payload 1500 B a frame; a stream counts only if its receiving interface saw every frame.
    record "$scen" "$sys" "$test" 0 "$rep" "$(python3 -c '
import sys
total = 0.0
for line in open(sys.argv[1]):
    sent, secs, got = line.split()
    if int(got) < int(sent) or float(secs) <= 0:
        sys.exit("lost")
    total += int(sent) * 1500 / float(secs) / 1e6
print("%.3f" % total)' "$tmp/blast.out" 2>/dev/null || echo failed)"
}
# ompi SCEN SYSTEM REP CLUSTER PROGRAM ARGS... : Open MPI, TCP BTL on the cluster's subnet,
# rank 0 on node 0 / core 0, rank 1 on node 1 / core 1, mpirun in the management namespace
ompi() {
    local scen=$1 sys=$2 rep=$3 c=$4 prog=$5; shift 5
    local cmd=(timeout 600 ip netns exec "$MG" env PMIX_MCA_ptl_tcp_remote_connections=1
               PMIX_MCA_ptl_tcp_if_include=10.79.1.0/24 mpirun.openmpi --allow-run-as-root --oversubscribe
               --mca btl tcp,self --mca btl_tcp_if_include "${SUBNET[$c]}"
               -n 1 ip netns exec "${NS0[$c]}" taskset -c 0 "$build/$prog" "$@"
               : -n 1 ip netns exec "${NS1[$c]}" taskset -c 1 "$build/$prog" "$@")
    note_cmd "$scen" "$sys" "$(show "${cmd[@]}")"
    echo "== $scen | $sys | run $rep: $(show "${cmd[@]}")" >> "$raw"
    local d0 m0
    d0=$(txb "${NS0[$c]}" qv0); m0=$(txb "${NS0[$c]}" qvbm)
    locked "${cmd[@]}" > "$tmp/mpi.out" 2>> "$raw" || log "FAILED: $scen | $sys | run $rep (mpirun, see $raw)"
    cat "$tmp/mpi.out" >> "$raw"
    echo "bytes sent by node 0: qv0 $(( $(txb "${NS0[$c]}" qv0) - d0 )), management veth $(( $(txb "${NS0[$c]}" qvbm) - m0 ))" >> "$raw"
    local t s v mean avg80 rest n=0
    while read -r t s v mean avg80 rest; do
        case $t in
            bw|bibw) record "$scen" "$sys" "$t" "$s" "$rep" "$v"; n=$((n + 1)) ;;
            lat) record "$scen" "$sys" lat "$s" "$rep" "$v"; record "$scen" "$sys" lat_mean "$s" "$rep" "$mean"
                 record "$scen" "$sys" lat_avg80 "$s" "$rep" "$avg80"; n=$((n + 1)) ;;
        esac
    done < "$tmp/mpi.out"
    [ $n -gt 0 ] || record "$scen" "$sys" "$prog" 0 "$rep" "failed"
}

# run_alternating REP FUNC... : the systems of one repetition, reversed on even ones
run_alternating() {
    local rep=$1; shift
    local jobs=("$@") i
    if [ $((rep % 2)) = 0 ]; then
        for ((i = ${#jobs[@]} - 1; i >= 0; i--)); do eval "${jobs[$i]}"; done
    else
        for i in "${jobs[@]}"; do eval "$i"; done
    fi
}
# windows and iterations of a bandwidth run: windows of at most 64 MiB (64 messages below
# 1 MiB), about BW_BYTES per run (10 to 1000 windows); quiver caps udp windows to 2 MiB.
bw_window() { local w=$(( (64 << 20) / $1 )); [ $w -gt 64 ] && w=64; [ $w -lt 1 ] && w=1; echo $w; }
bw_iters() {  # SIZE WINDOW
    local it=$(( BW_BYTES / ($1 * $2) )); [ $it -lt 10 ] && it=10; [ $it -gt 1000 ] && it=1000; echo $it
}
udp_window() { local w; w=$(bw_window "$1"); local cap=$(( (2 << 20) / $1 )); [ $cap -lt 1 ] && cap=1; [ $w -gt $cap ] && w=$cap; echo $w; }
q_bw() {      # q_bw SCEN SYS REP C TRANSPORT SIZE [extra args]
    local scen=$1 sys=$2 rep=$3 c=$4 tr=$5 size=$6; shift 6
    local w ew; w=$(bw_window "$size"); ew=$w; [ "$tr" = udp ] && ew=$(udp_window "$size")
    qbench "$scen" "$sys" "$rep" "$c" bw --transport "$tr" --sizes "$size" --window "$w" --iters "$(bw_iters "$size" "$ew")" "$@"
}
K=1024; M=$((1024 * 1024))
start=$(date +%s)
log "results in $out; REPS=$REPS QUICK=$QUICK SCENARIOS='$SCENARIOS'"

# ================= unshaped veth (scenario 1) and GAMMA's Table 1 (scenario 4)
if has unshaped || has gamma; then
    U=$tag-u1500
    cluster_up "$U" --link unlimited --mtu 1500
    jumbo=()
    if has unshaped; then
        for mtu in 9000 65000; do cluster_up "$tag-u$mtu" --link unlimited --mtu "$mtu"; jumbo+=("$mtu"); done
        mgmt_up "$U"
    fi
    S=unshaped; G=gamma
    for rep in $(seq "$REPS"); do
        log "unshaped / gamma: repetition $rep/$REPS"
        jobs=(
            "qbench $S 'quiver eth' $rep $U pingpong --transport eth --wait spin --sizes 8 --iters $LAT_ITERS"
            "rawpp $S 'AF_PACKET ping-pong (busy)' $rep $U afpacket"
            "rawpp $S 'AF_PACKET ring ping-pong' $rep $U afring"
            "qbench $S 'quiver udp' $rep $U pingpong --transport udp --wait spin --sizes 8 --iters $LAT_ITERS"
            "rawpp $S 'UDP ping-pong (busy)' $rep $U udp"
        )
        has gamma && jobs+=("rawpp $G 'TCP ping-pong (busy)' $rep $U tcp")
        run_alternating "$rep" "${jobs[@]}"
        jobs=()
        for size in $((64 * K)) $((256 * K)) $M $((4 * M)) $((16 * M)); do
            jobs+=("q_bw $S 'quiver eth' $rep $U eth $size" "q_bw $S 'quiver udp' $rep $U udp $size")
        done
        has unshaped && jobs+=("ompi $S 'Open MPI (ob1/tcp)' $rep $U pp_ompi -t bw -m $((64 * K)) -x $((16 * M)) -B $((64 * M)) -T $MPI_T")
        jobs+=("iperf $S 'iperf3 TCP' $rep $U")
        has gamma && jobs+=("iperf $G 'iperf3 UDP (-b 0 -l 1472)' $rep $U -u -b 0 -l 1472")
        for mtu in "${jumbo[@]}"; do
            for size in $((64 * K)) $M $((16 * M)); do
                jobs+=("q_bw $S 'quiver eth MTU $mtu' $rep $tag-u$mtu eth $size" "q_bw $S 'quiver udp MTU $mtu' $rep $tag-u$mtu udp $size")
            done
        done
        run_alternating "$rep" "${jobs[@]}"
    done
    mgmt_down
    for mtu in "${jumbo[@]}"; do cluster_down "$tag-u$mtu"; done
    cluster_down "$U"
fi

# ================= 100 Mbit/s (scenario 2)
# ping-pong sizes: powers of two and the 1.5x steps between them, 8 B .. 64 KiB
PP_SMALL=8,12,16,24,32,48,64,96,128,192,256,384,512,768,1024,1536,2048,3072
PP_LARGE=4096,6144,8192,12288,16384,24576,32768,49152,65536
if has 100mbit; then
    C=$tag-100m; S=100mbit
    cluster_up "$C" --link 100mbit --mtu 1500
    mgmt_up "$C"
    for rep in $(seq "$REPS"); do
        log "100mbit: repetition $rep/$REPS"
        jobs=()
        for tr in eth udp; do
            jobs+=("qbench $S 'quiver $tr' $rep $C bw --transport $tr --sizes $M --window 4 --iters $SHAPED_WINDOWS"
                   "qbench $S 'quiver $tr' $rep $C bw --transport $tr --sizes $((16 * M)) --window 1 --iters $((SHAPED_WINDOWS / 2)) --warmup 1")
        done
        for tr in eth udp; do   # diagnostic: the same without retransmission
            jobs+=("qbench $S 'quiver $tr --reliability none' $rep $C bw --transport $tr --reliability none --sizes $M --window 4 --iters $SHAPED_WINDOWS")
        done
        for tr in eth udp; do
            jobs+=("qbench $S 'quiver $tr' $rep $C pingpong --transport $tr --wait spin --sizes $PP_SMALL --iters $PP_SMALL_ITERS"
                   "qbench $S 'quiver $tr' $rep $C pingpong --transport $tr --wait spin --sizes $PP_LARGE --iters $PP_LARGE_ITERS")
        done
        # GAMMA's ports over eth (issue 32): the curve, the buffered curve (one extra
        # receive copy, GAMMA's curve 1) and the large-message throughput
        for copy in "" "--ports-copy"; do
            name="quiver ports eth${copy:+ buffered}"
            jobs+=("qbench $S '$name' $rep $C pingpong --api ports $copy --transport eth --wait spin --sizes $PP_SMALL --iters $PP_SMALL_ITERS"
                   "qbench $S '$name' $rep $C pingpong --api ports $copy --transport eth --wait spin --sizes $PP_LARGE --iters $PP_LARGE_ITERS")
        done
        jobs+=("qbench $S 'quiver ports eth' $rep $C bw --api ports --transport eth --sizes $M --window 4 --iters $SHAPED_WINDOWS")
        # diagnostic: the eth curve with --wait block (the cores are free for the kernel's tbf timers)
        jobs+=("qbench $S 'quiver eth --wait block' $rep $C pingpong --transport eth --wait block --sizes $PP_SMALL --iters $PP_SMALL_ITERS"
               "qbench $S 'quiver eth --wait block' $rep $C pingpong --transport eth --wait block --sizes $PP_LARGE --iters $PP_LARGE_ITERS")
        # the limits: raw AF_PACKET ping-pongs (60-byte frames) through the same two tbfs
        jobs+=("rawpp $S 'AF_PACKET ping-pong (busy)' $rep $C afpacket"
               "rawpp $S 'AF_PACKET ring ping-pong' $rep $C afring")
        jobs+=("ompi $S 'Open MPI (ob1/tcp)' $rep $C mpi_lat $PP_SMALL,$PP_LARGE $MPI_T"
               "iperf $S 'iperf3 TCP' $rep $C")
        run_alternating "$rep" "${jobs[@]}"
    done
    { echo "== tbf statistics after 100mbit"; ip netns exec "${NS0[$C]}" tc -s qdisc show dev qv0
      ip netns exec "${NS1[$C]}" tc -s qdisc show dev qv0; ip netns exec "qv-$C-sw" tc -s qdisc show 2>/dev/null; } >> "$raw" 2>&1
    mgmt_down
    cluster_down "$C"
fi

# ================= 1 Gbit/s (scenario 3)
if has 1gbit; then
    C=$tag-1g; S=1gbit
    cluster_up "$C" --link 1gbit --mtu 1500
    for rep in $(seq "$REPS"); do
        log "1gbit: repetition $rep/$REPS"
        jobs=()
        for tr in eth udp; do
            jobs+=("qbench $S 'quiver $tr' $rep $C bw --transport $tr --sizes $M --window 16 --iters $((SHAPED_WINDOWS * 2))"
                   "qbench $S 'quiver $tr' $rep $C bw --transport $tr --sizes $((16 * M)) --window 1 --iters $((SHAPED_WINDOWS * 2))"
                   "qbench $S 'quiver $tr' $rep $C bibw --transport $tr --sizes $M --window 16 --iters $((SHAPED_WINDOWS * 10))"
                   "qbench $S 'quiver $tr' $rep $C bibw --transport $tr --sizes $((16 * M)) --window 1 --iters $((SHAPED_WINDOWS * 2))")
        done
        for tr in eth udp; do
            jobs+=("qbench $S 'quiver $tr --reliability none' $rep $C bw --transport $tr --reliability none --sizes $M --window 16 --iters $((SHAPED_WINDOWS * 2))")
        done
        jobs+=("iperf $S 'iperf3 TCP' $rep $C"
               "blast $S 'raw AF_PACKET stream' $rep $C uni"
               "blast $S 'raw AF_PACKET stream' $rep $C bi")
        run_alternating "$rep" "${jobs[@]}"
    done
    { echo "== tbf statistics after 1gbit"; ip netns exec "${NS0[$C]}" tc -s qdisc show dev qv0
      ip netns exec "${NS1[$C]}" tc -s qdisc show dev qv0; ip netns exec "qv-$C-sw" tc -s qdisc show 2>/dev/null; } >> "$raw" 2>&1
    cluster_down "$C"
fi

elapsed=$(( $(date +%s) - start ))
log "measurements done in ${elapsed} s; summarising"
python3 "$here/summarise.py" "$out" "$REPS" "$elapsed" "$SCENARIOS" | tee "$out/tables.md"
