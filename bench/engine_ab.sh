#!/bin/bash
# engine_ab.sh: two revisions of quiver side by side, for "engine redesign must not lose
# speed": instruction counts per message (the valgrind method of
# bench/cluster/valgrind_echo.sh) and the medians of `quiver bench pingpong` and `bw` over
# shm (one host), udp and eth (an unshaped 2-node emulated cluster), the two builds
# alternated ROUNDS times (docs/PERFORMANCE.md: A/Bs are judged on alternated runs).
# Targets: instruction counts of B within +3 % of A; latency and bandwidth medians of B
# within the spread of the rounds.
#
# usage: bash bench/engine_ab.sh REV_A REV_B
#   REV_A, REV_B  git revisions (commit, branch, tag); each is built once (`cargo build
#                 --release -p quiver-cli`, niced) in its own worktree (removed after the
#                 build) and target dir OUT/target-SHA; the binary is kept as OUT/quiver-SHA
#                 and reused by later runs (REBUILD=1 builds again). Only `quiver run`,
#                 `quiver cluster` and `quiver bench pingpong|bw` options that 7df76b0
#                 already had are used. Needs root (the cluster, AF_PACKET) and 2 cores.
# knobs: ROUNDS     alternations of the timing runs (default 3; B first in even rounds)
#        ITERS      ping-pong round trips per timing run (default 100000)
#        BW_ITERS   windows per bw run (default: quiver's, by size)
#        PP_SIZE    ping-pong message size of the timing runs (default 8)
#        BW_SIZES   bw message sizes, one run per transport (default 64K,1M)
#        VG_ITERS   the two ping-pong lengths run under callgrind (default "5000 20000")
#        VG_REPS    repetitions of each callgrind run (default 3; at least 2 for the fit)
#        VG_SIZE    message size of the callgrind ping-pongs (default 8)
#        VG_POLL    regex of the poll function whose calls are counted (default
#                   ::(Endpoint::poll_once|Station::poll)$: the endpoint's poll before
#                   416bb75, the station's after; with API=tagged,
#                   (Tagged>|PushPull)::poll$: tagged's poll before and after it moved
#                   onto the protocol hook)
#        API        the message API of every benchmark: dm (default) or tagged (Push-Pull
#                   tagged send/receive, `--api tagged`; the counts' write, read and
#                   release figures are then those of the bench's Ctx::send/recv)
#        CLUSTER    a 2-node cluster to use (default engine-ab); made with `quiver cluster
#                   up CLUSTER --nodes 2` if absent, and then removed at exit
#        STEPS      what to run after the builds: "counts timing" (default) or one of
#                   them; "summary" only prints the tables again from OUT
#        OUT        results (default target/engine-ab): summary.md (the tables printed at
#                   the end, the last one ready for docs/PERFORMANCE.md), counts.tsv,
#                   timing.tsv (one line per run and figure), raw.log (every command and
#                   its output), callgrind/*.out
#        NICE       niceness of the builds (default 19); TIMEOUT per job (default 600 s)
#
# What is measured
#   counts   `quiver bench pingpong --transport T --wait spin --sizes VG_SIZE --iters N
#            --warmup 100` started by `quiver run -n 2` (shm: this host; udp, eth: the
#            cluster, one rank per node), rank 1, the echo side, under `valgrind
#            --tool=callgrind`, rank i pinned to core i; N is each of VG_ITERS, VG_REPS
#            times, A and B alternating. A round trip of the echo rank is one read, one
#            release (the message's drop) and one write, plus the empty polls while it
#            waits, whose number follows the timing under valgrind (and the machine's
#            load). Figures, per round trip: the rank's ping-pong loop
#            (pingpong::one_way_samples, inclusive; the primary figure, whatever the
#            library's functions are called), the whole rank (the total; start-up and close
#            add timing-dependent work: clock calibration, rendezvous, the close's linger),
#            and the inclusive counts of Endpoint::write, of the bench's read (Ctx::recv,
#            which Endpoint::read is inlined into) and of the release (drop_in_place of
#            Message). Each is fitted over all runs of a revision as count = a + b *
#            round trips + e * (poll calls - round trips): b is the count per round trip
#            with start-up and empty polls taken out (with no poll variation, the
#            difference of the two lengths divided by their difference), shown with its
#            standard error. write and release are exact; the udp figures scatter most.
#   timing   `quiver bench pingpong --sizes PP_SIZE --iters ITERS` and `quiver bench bw
#            --sizes BW_SIZES` with `--wait spin --format json`, over shm (this host) and
#            over udp and eth (`--cluster CLUSTER`); quiver bench pins rank i to core i
#            itself. Figures: latency_us_median (median one-way time) and
#            bandwidth_MBps_median (median of the per-window bandwidths). In each round
#            every command runs with A then B (B then A in even rounds), each run under the
#            exclusive lock on /tmp/bench.lock (builds and callgrind runs take the shared
#            one, as bench/cluster.sh does). "noise" is the larger spread (max - min) /
#            median of either build over the rounds; B/A within 1 +- noise is "within
#            noise". Compare the per-round ratios too: the machine's phase can change
#            within a session.
set -euo pipefail
usage="usage: bash bench/engine_ab.sh REV_A REV_B (knobs: ROUNDS ITERS BW_ITERS PP_SIZE BW_SIZES VG_ITERS VG_REPS VG_SIZE VG_POLL API CLUSTER STEPS OUT NICE TIMEOUT REBUILD)"
[ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${ROUNDS:-3}
iters=${ITERS:-100000}
bw_iters=${BW_ITERS:-}
pp_size=${PP_SIZE:-8}
bw_sizes=${BW_SIZES:-64K,1M}
read -r vg_n1 vg_n2 <<<"${VG_ITERS:-5000 20000}"
vg_reps=${VG_REPS:-3}
api=${API:-dm}
case $api in
    dm) vg_poll=${VG_POLL:-::(Endpoint::poll_once|Station::poll)\$} ;;
    tagged) vg_poll=${VG_POLL:-(Tagged>|PushPull)::poll\$} ;;
    *) echo "engine_ab.sh: API=$api: dm or tagged" >&2; exit 2 ;;
esac
vg_size=${VG_SIZE:-8}
cluster=${CLUSTER:-engine-ab}
steps=${STEPS:-counts timing}
out=${OUT:-$root/target/engine-ab}
nice_level=${NICE:-19}
timeout=${TIMEOUT:-600}
LOCK=/tmp/bench.lock

die() { echo "engine_ab.sh: $*" >&2; exit 1; }
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
has() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
for s in $steps; do case $s in counts|timing|summary) ;; *) die "unknown step '$s' (counts timing summary)" ;; esac; done
[ "$steps" = summary ] || ! has summary || die "STEPS=summary stands alone"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"
[[ $vg_reps =~ ^[1-9][0-9]*$ ]] || die "VG_REPS must be a positive integer"
[[ ${vg_n1:-} =~ ^[0-9]+$ && ${vg_n2:-} =~ ^[0-9]+$ && $vg_n2 -gt $vg_n1 && $vg_n1 -gt 0 ]] ||
    die "VG_ITERS must be two increasing counts, e.g. \"10000 30000\""
[ "$(id -u)" = 0 ] || die "needs root (the emulated cluster, raw Ethernet)"
[ "$(nproc)" -ge 2 ] || die "needs 2 cores (rank i is pinned to core i)"
command -v python3 >/dev/null || die "needs python3"
command -v flock >/dev/null || die "needs flock (util-linux)"

mkdir -p "$out/callgrind"
out=$(cd "$out" && pwd)
raw=$out/raw.log
has summary || : >"$raw"
tmp=$(mktemp -d)
trees=()
made_cluster=""
cleanup() {
    for t in "${trees[@]}"; do git -C "$root" worktree remove --force "$t" >/dev/null 2>&1 || true; done
    if [ -n "$made_cluster" ]; then
        log "removing cluster $cluster"
        "$made_cluster" cluster down "$cluster" >>"$raw" 2>&1 || echo "engine_ab.sh: 'quiver cluster down $cluster' failed" >&2
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # locked, building, show

# ---- builds: one worktree and target dir per revision
sha_a=$(git -C "$root" rev-parse --verify "$1^{commit}") || die "no revision $1"
sha_b=$(git -C "$root" rev-parse --verify "$2^{commit}") || die "no revision $2"
short_a=$(git -C "$root" rev-parse --short "$sha_a")
short_b=$(git -C "$root" rev-parse --short "$sha_b")
cargo_build() { nice -n "$nice_level" cargo build -q --release -p quiver-cli --target-dir "$1"; }
build() {      # build SHA SHORT: leaves OUT/quiver-SHORT
    local sha=$1 short=$2 bin=$out/quiver-$2 tree=$out/tree-$2
    if [ -x "$bin" ] && [ "${REBUILD:-0}" != 1 ] && [ "$(cat "$bin.sha" 2>/dev/null)" = "$sha" ]; then
        log "using $bin (built before from $sha; REBUILD=1 builds again)"
        return
    fi
    git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || true
    git -C "$root" worktree add -f --detach "$tree" "$sha" >/dev/null
    trees+=("$tree")
    log "building $short (nice $nice_level, target dir $out/target-$short)"
    (cd "$tree" && building cargo_build "$out/target-$short") || die "build of $short failed"
    cp "$out/target-$short/release/quiver" "$bin.tmp" && mv "$bin.tmp" "$bin"
    echo "$sha" >"$bin.sha"
    git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || true
}
if ! has summary; then
    build "$sha_a" "$short_a"
    [ "$sha_b" = "$sha_a" ] || build "$sha_b" "$short_b"
fi
QA=$out/quiver-$short_a
QB=$out/quiver-$short_b
declare -A BIN=([A]=$QA [B]=$QB)
declare -A REV=([A]=$short_a [B]=$short_b)
has summary || log "A = $short_a ($1), B = $short_b ($2)"

# ---- the cluster: an unshaped 2-node one, made here unless CLUSTER names one that exists
cluster_info() {   # prints "NODES LINK LOSS" of cluster $cluster, nothing if absent
    "$QA" cluster list --format json 2>>"$raw" | python3 -c '
import json, sys
name = sys.argv[1]
try:
    data = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
for c in data if isinstance(data, list) else data.get("clusters", []):
    if c.get("name") == name:
        n = c.get("nodes")
        n = len(n) if isinstance(n, list) else n
        print(n, c.get("link", "?"), c.get("loss", 0))
' "$cluster"
}
has counts || has timing || info="- - -"
info=${info:-$(cluster_info)}
if [ -z "$info" ]; then
    log "making cluster $cluster: quiver cluster up $cluster --nodes 2"
    "$QA" cluster up "$cluster" --nodes 2 >>"$raw" 2>&1 || die "quiver cluster up $cluster --nodes 2 failed (see $raw)"
    made_cluster=$QA
    info=$(cluster_info)
fi
read -r c_nodes c_link c_loss <<<"$info"
if ! has summary; then
    [ "${c_nodes:-0}" -ge 2 ] 2>/dev/null || die "cluster $cluster has ${c_nodes:-no} nodes; it needs 2"
    [ "$c_link" = unlimited ] || log "warning: cluster $cluster is shaped ($c_link); the issue asks for an unshaped one"
    python3 -c "import sys; sys.exit(float(sys.argv[1]) != 0)" "$c_loss" 2>/dev/null ||
        log "warning: cluster $cluster drops frames (loss $c_loss)"
fi
knobs=""   # the knobs of the steps run, for the command line in the tables
has timing && knobs+=" ROUNDS=$rounds ITERS=$iters${bw_iters:+ BW_ITERS=$bw_iters} PP_SIZE=$pp_size BW_SIZES=$bw_sizes"
has counts && knobs+=" VG_ITERS='$vg_n1 $vg_n2' VG_REPS=$vg_reps VG_SIZE=$vg_size${VG_POLL:+ VG_POLL='$vg_poll'}"
[ "$api" = dm ] || knobs+=" API=$api"
[ "$steps" = "counts timing" ] || knobs=" STEPS='$steps'$knobs"
[ "$cluster" = engine-ab ] || knobs=" CLUSTER=$cluster$knobs"
knobs=${knobs# }
command_line="$knobs bash bench/engine_ab.sh $short_a $short_b"

# ---- instruction counts
counts=$out/counts.tsv
cg_parse=$tmp/cg_parse.py
cat >"$cg_parse" <<'EOF'
# cg_parse.py LABEL REV TRANSPORT N REP FILE POLL_REGEX: the rank's total and the inclusive count
# and number of calls of the functions below, from a callgrind out file (inclusive =
# self + calls made, per symbol, whatever source file its inlined pieces come from).
import re, sys
label, rev, tr, n, rep, path, poll_rx = sys.argv[1:]
names = {}
def name(ref):
    m = re.match(r"\((\d+)\)(?:\s+(.*))?$", ref.strip())
    if not m:
        return ref.strip()
    if m.group(2) is not None:
        names[m.group(1)] = m.group(2)
    return names.get(m.group(1), ref.strip())
selfc, callc, ncalls = {}, {}, {}
total, cur, cfn, pending = None, None, None, False
for line in open(path, errors="replace"):
    c = line[:1]
    if c.isdigit() or c in "+-*":
        if cur is None:
            continue
        parts = line.split()
        cost = int(parts[1]) if len(parts) > 1 else 0
        if pending:
            if cfn != cur:      # a recursive call is in the inclusive count already
                callc[cur] = callc.get(cur, 0) + cost
            pending = False
        else:
            selfc[cur] = selfc.get(cur, 0) + cost
    elif line.startswith("fn="):
        cur = name(line[3:])
    elif line.startswith("cfn="):
        cfn = name(line[4:])
    elif line.startswith("calls="):
        pending = True
        ncalls[cfn] = ncalls.get(cfn, 0) + int(line[6:].split()[0])
    elif line.startswith(("summary:", "totals:")):
        total = int(line.split()[1])
if total is None:
    sys.exit(f"engine_ab.sh: no total in {path}")
out = [("total", "-", total, 1)]
# Candidates by name suffix (the module path may move); every symbol of one name is
# summed (copies of a generic). The summary uses, per figure, the first candidate found
# in both revisions.
want = [
    ("loop", r"::pingpong::(tagged_)?one_way_samples$"),
    ("write", r"::Endpoint::write$"), ("write", r"::Ctx::send$"),
    ("read", r"::Endpoint::read$"), ("read", r"::Ctx::recv$"),
    ("release", r"^core::ptr::drop_in_place<quiver::[A-Za-z_:]*::Message>$"),
    ("release", r"^<quiver::[A-Za-z_:]*::Message as core::ops::drop::Drop>::drop$"),
    ("poll", poll_rx),
]
incl = {f: selfc.get(f, 0) + callc.get(f, 0) for f in set(selfc) | set(callc)}
for key, rx in want:
    hits = sorted(f for f in incl if re.search(rx, re.sub(r"::h[0-9a-f]{16}$", "", f)))
    if hits:
        out.append((key, rx, sum(incl[f] for f in hits), sum(ncalls.get(f, 0) for f in hits)))
for key, rx, v, calls in out:
    print(label, rev, tr, n, rep, key, rx, v, calls, sep="\t")
EOF
vg_run() {     # vg_run LABEL TRANSPORT N REP: rank 1 of an N-iteration ping-pong under callgrind
    local label=$1 tr=$2 n=$3 rep=$4 bin=${BIN[$1]} env_tr where=()
    local f=$out/callgrind/$tr-${REV[$1]}-$n-$rep.out
    case $tr in shm) env_tr=auto ;; *) env_tr=$tr; where=(--cluster "$cluster") ;; esac
    local bench="$bin bench pingpong --api $api --transport $tr --wait spin --sizes $vg_size --iters $n --warmup 100 --format json"
    local vg="valgrind --tool=callgrind --callgrind-out-file=$f"
    rm -f "$f"
    # The variables a benchmark child reads (bench::launch::child_env), so that `quiver
    # run` starts the two ranks of one ping-pong directly; rank i pinned to core i.
    local cmd=(env QUIVER_BENCH_CHILD=1 QUIVER_TRANSPORT=$env_tr QUIVER_WAIT=spin
        "$bin" run "${where[@]}" -n 2 --timeout "$timeout" --
        sh -c "if [ \"\$QUIVER_RANK\" = 1 ]; then exec taskset -c 1 $vg $bench; else exec taskset -c 0 $bench; fi")
    echo "== counts $label ${REV[$label]} $tr $n rep $rep: $(show "${cmd[@]}")" >>"$raw"
    local rc=0
    building "${cmd[@]}" >"$tmp/vg.out" 2>&1 || rc=$?
    cat "$tmp/vg.out" >>"$raw"
    if [ $rc != 0 ]; then log "FAILED ($rc): counts $label $tr $n (see $raw)"; return 1; fi
    python3 "$cg_parse" "$label" "${REV[$label]}" "$tr" "$n" "$rep" "$f" "$vg_poll" >>"$counts"
}
if has counts; then
    command -v valgrind >/dev/null || { log "installing valgrind"; { apt-get install -y valgrind || { apt-get update && apt-get install -y valgrind; }; } >>"$raw" 2>&1 ||
        die "apt-get install -y valgrind failed (see $raw)"; }
    : >"$counts"
    printf '%s\t%s\t%s\n' "$command_line" "$(date -u +%Y-%m-%d)" "$cluster $c_link" >"$counts.meta"
    for rep in $(seq 1 "$vg_reps"); do
        for tr in shm udp eth; do
            for n in "$vg_n1" "$vg_n2"; do
                for label in A B; do
                    log "callgrind $rep/$vg_reps: $tr, $label (${REV[$label]}), $n iterations"
                    vg_run "$label" "$tr" "$n" "$rep" || true
                done
            done
        done
    done
fi

# ---- timing, alternated
timing=$out/timing.tsv
tbench() {     # tbench ROUND LABEL BENCH TRANSPORT
    local round=$1 label=$2 bench=$3 tr=$4 bin=${BIN[$2]} args=()
    case $bench in
        pingpong) args=(--sizes "$pp_size" --iters "$iters") ;;
        bw) args=(--sizes "$bw_sizes"); [ -z "$bw_iters" ] || args+=(--iters "$bw_iters") ;;
    esac
    [ "$tr" = shm ] || args+=(--cluster "$cluster")
    local cmd=("$bin" bench "$bench" --api "$api" --transport "$tr" --wait spin "${args[@]}" --format json --timeout "$timeout")
    echo "== timing round $round $label ${REV[$label]}: $(show "${cmd[@]}")" >>"$raw"
    local rc=0
    locked "${cmd[@]}" >"$tmp/t.out" 2>"$tmp/t.err" || rc=$?
    cat "$tmp/t.out" "$tmp/t.err" >>"$raw"
    [ $rc = 0 ] || log "FAILED ($rc): $(show "${cmd[@]}"): $(tail -c 300 "$tmp/t.err")"
    python3 - "$round" "$label" "${REV[$label]}" "$tr" "$tmp/t.out" >>"$timing" <<'EOF'
import json, sys
rnd, label, rev, tr, path = sys.argv[1:]
def size(b):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s} {unit}"
    return f"{b} B"
for line in open(path):
    if not line.startswith("{"):
        continue
    o = json.loads(line)
    if o["bench"] == "pingpong":
        fig, v = f"{tr} pingpong {size(o['size'])} one-way median (µs)", o.get("latency_us_median")
    else:
        fig, v = f"{tr} {o['bench']} {size(o['size'])} median (MB/s)", o.get("bandwidth_MBps_median")
    if v is not None:
        print(fig, rnd, label, rev, v, sep="\t")
EOF
}
if has timing; then
    : >"$timing"
    printf '%s\t%s\t%s\n' "$command_line" "$(date -u +%Y-%m-%d)" "$cluster $c_link" >"$timing.meta"
    for round in $(seq 1 "$rounds"); do
        order="A B"; [ $((round % 2)) = 0 ] && order="B A"
        for tr in shm udp eth; do
            for bench in pingpong bw; do
                for label in $order; do
                    log "round $round/$rounds: $tr $bench, $label (${REV[$label]})"
                    tbench "$round" "$label" "$bench" "$tr"
                done
            done
        done
    done
fi

# ---- the tables
# the tables of this run's steps (STEPS=summary: of whatever OUT holds)
counts=$out/counts.tsv timing=$out/timing.tsv
has summary || has counts || counts=/nonexistent
has summary || has timing || timing=/nonexistent
python3 - "$counts" "$timing" "$short_a" "$short_b" "$vg_poll" <<'EOF' | tee "$out/summary.md"
import os, statistics, sys
counts_path, timing_path, rev_a, rev_b, poll_rx = sys.argv[1:]
lines = []
say = lines.append
def fmt(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.4g}"

def load(path):
    if not os.path.exists(path):
        return []
    return [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]

# instruction counts. Every run r of a revision gives count_r = a + b * M_r + e * Q_r, with
# M_r = iterations + warm-up (round trips) and Q_r = poll calls - M_r (the empty polls,
# which follow the timing under valgrind); a least-squares fit over all runs (both
# lengths, every repetition) gives b, the count per round trip without empty polls, and
# its standard error. Without the poll function, or when Q does not vary, the fit is
# count = a + b * M (the difference of the two lengths).
runs = {}
revs = {}
for label, rev, tr, n, rep, key, rx, v, calls in load(counts_path):
    runs.setdefault((label, tr), {}).setdefault((int(n), int(rep)), {})[(key, rx)] = (int(v), int(calls))
    revs[label] = rev
lengths = sorted({n for d in runs.values() for n, _ in d})
n1, n2 = (lengths[0], lengths[-1]) if lengths else (0, 1)
vg_reps = max((r for d in runs.values() for _, r in d), default=0)
POLL = ("poll", poll_rx)
LOOP = ("loop", r"::pingpong::(tagged_)?one_way_samples$")

def solve(rows, ys):
    """Least squares; returns (coefficients, standard errors) or None if singular."""
    k = len(rows[0])
    xtx = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    xty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(k)]
    aug = [xtx[i] + [xty[i]] + [1.0 if j == i else 0.0 for j in range(k)] for i in range(k)]
    for c in range(k):
        p = max(range(c, k), key=lambda r: abs(aug[r][c]))
        aug[c], aug[p] = aug[p], aug[c]
        if abs(aug[c][c]) <= 1e-9 * max(1.0, xtx[c][c]):
            return None
        for r in range(k):
            if r != c:
                f = aug[r][c] / aug[c][c]
                aug[r] = [x - f * y for x, y in zip(aug[r], aug[c])]
    coef = [aug[i][k] / aug[i][i] for i in range(k)]
    inv_diag = [aug[i][k + 1 + i] / aug[i][i] for i in range(k)]
    dof = len(rows) - k
    rss = sum((y - sum(c * x for c, x in zip(coef, r))) ** 2 for r, y in zip(rows, ys))
    se = [((rss / dof) * d) ** 0.5 if dof > 0 and d > 0 else None for d in inv_diag]
    return coef, se

def fit(label, tr, key):
    """(b, its standard error, e or None) for figure `key` of (label, tr), or None."""
    rs = [(n, d) for (n, _), d in runs.get((label, tr), {}).items() if key in d]
    if len({n for n, _ in rs}) < 2:
        return None
    ms = [n + 100 for n, _ in rs]
    ys = [d[key][0] for _, d in rs]
    qs = [d[POLL][1] - m if POLL in d else None for (_, d), m in zip(rs, ms)]
    if None not in qs and len(rs) >= 4 and max(qs) - min(qs) > 0.01 * min(ms):
        s = solve([[1.0, m, q] for m, q in zip(ms, qs)], ys)
        if s:
            return s[0][1], s[1][1], s[0][2]
    s = solve([[1.0, m] for m in ms], ys)
    return (s[0][1], s[1][1], None) if s else None

def raw_range(label, tr, key):   # (count at N2 - count at N1) / (N2 - N1), repetition by repetition
    d = runs.get((label, tr), {})
    v = [(d[(n2, r)][key][0] - d[(n1, r)][key][0]) / (n2 - n1)
         for (n, r) in d if n == n1 and (n2, r) in d and key in d[(n1, r)] and key in d[(n2, r)]]
    return (min(v), max(v)) if v else None

cands = {"write": [r"::Endpoint::write$", r"::Ctx::send$"], "read": [r"::Endpoint::read$", r"::Ctx::recv$"],
         "release": [r"^core::ptr::drop_in_place<quiver::[A-Za-z_:]*::Message>$",
                     r"^<quiver::[A-Za-z_:]*::Message as core::ops::drop::Drop>::drop$"]}
shown = {r"::Endpoint::write$": "`Endpoint::write`", r"::Ctx::send$": "`Ctx::send` (the bench's write)",
         r"::Endpoint::read$": "`Endpoint::read`", r"::Ctx::recv$": "`Ctx::recv` (the bench's read)",
         cands["release"][0]: "`drop_in_place<Message>`", cands["release"][1]: "`Message::drop`"}
pm = lambda v, se: "-" if v is None else fmt(v) + ("" if not se or se < 0.05 else f" ± {se:.0f}" if se >= 10 else f" ± {se:.2g}")
count_rows = []   # (figure, A text, B text, ratio, verdict)
for tr in ("shm", "udp", "eth"):
    if not any((lab, tr) in runs for lab in ("A", "B")):
        continue
    def row(fig, key, target):
        fa, fb = fit("A", tr, key), fit("B", tr, key)
        ratio = fb[0] / fa[0] if fa and fb and fa[0] else None
        verdict = "-"
        if target and ratio is not None:
            # beyond +3 % by more than twice the standard error of the difference: not met
            err = ((1.03 * (fa[1] or 0)) ** 2 + (fb[1] or 0) ** 2) ** 0.5
            excess = fb[0] - 1.03 * fa[0]
            verdict = "**met**" if excess <= 0 else "**not met**" if excess > 2 * err else "unclear (within the error)"
        count_rows.append((f"{tr}: {fig}", pm(*fa[:2]) if fa else "-", pm(*fb[:2]) if fb else "-", ratio, verdict))
        return fa, fb
    present = lambda k: all(k in d for lab in ("A", "B") for d in runs.get((lab, tr), {}).values())
    loop = row("instructions per round trip, the echo rank's ping-pong loop (read + release + write)", LOOP, True) \
        if present(LOOP) else None
    whole = row("instructions per round trip, the whole echo rank (start-up and close vary with timing)",
                ("total", "-"), True)
    fa, fb = loop or whole
    for key in ("write", "read", "release"):
        rx = next((r for r in cands[key] if present((key, r))), None)
        if rx:
            row(f"instructions per {key}, {shown[rx]} inclusive", (key, rx), True)
    def polls(lab):
        q = [(d[POLL][1] - n - 100) / (n + 100) for (n, _), d in runs.get((lab, tr), {}).items() if POLL in d]
        return f"{min(q):.2f}-{max(q):.2f}" if q else "-"
    ecost = lambda f: fmt(f[2]) if f and f[2] is not None else "-"
    count_rows.append((f"{tr}: poll calls per round trip beyond one (min-max over the runs); instructions per extra poll (fitted)",
                       f"{polls('A')}; {ecost(fa)}", f"{polls('B')}; {ecost(fb)}", None, "-"))
    ra, rb = raw_range("A", tr, ("total", "-")), raw_range("B", tr, ("total", "-"))
    rr = lambda r: f"{fmt(r[0])}-{fmt(r[1])}" if r else "-"
    count_rows.append((f"{tr}: whole echo rank, plain difference of the two lengths (range over repetitions)",
                       rr(ra), rr(rb), None, "-"))

# timing: per round and figure
timing = {}
order = []
for fig, rnd, label, rev, v in load(timing_path):
    revs[label] = rev
    if fig not in order:
        order.append(fig)
    timing.setdefault(fig, {}).setdefault(label, {})[int(rnd)] = float(v)
time_rows = []
for fig in order:
    per = timing[fig]
    ra, rb = per.get("A", {}), per.get("B", {})
    rs = sorted(set(ra) | set(rb))
    va, vb = [ra[r] for r in rs if r in ra], [rb[r] for r in rs if r in rb]
    ma = statistics.median(va) if va else None
    mb = statistics.median(vb) if vb else None
    paired = [rb[r] / ra[r] for r in rs if r in ra and r in rb and ra[r]]
    ratio = mb / ma if ma and mb is not None else None
    spreads = [(max(v) - min(v)) / statistics.median(v) for v in (va, vb) if len(v) >= 2 and statistics.median(v)]
    noise = max(spreads) if spreads else None
    lower_better = "µs" in fig
    if ratio is None:
        verdict = "-"
    elif noise is None:
        verdict = "n/a (one round)"
    elif abs(ratio - 1) <= noise:
        verdict = "within noise"
    else:
        verdict = "B slower" if (ratio > 1) == lower_better else "B faster"
    time_rows.append((fig, va, vb, paired, ma, mb, ratio, noise, verdict))

rounds = max((r for per in timing.values() for lab in per.values() for r in lab), default=0)
rev_a, rev_b = revs.get("A", rev_a), revs.get("B", rev_b)
metas = []
for path in (counts_path, timing_path):
    if os.path.exists(path + ".meta") and load(path):
        m = load(path + ".meta")[0]
        if m not in metas:
            metas.append(m)
say(f"A = {rev_a}, B = {rev_b}")
say("")
if count_rows:
    say(f"Instructions (callgrind, echo rank of the ping-pong, {vg_reps} repetition(s) of {n1} and of {n2} iterations; "
        "per round trip without empty polls, fitted over the runs, ± its standard error):")
    say("")
    say("| figure | A | B | B/A | target B/A <= 1.03 |")
    say("|---|---|---|---|---|")
    for fig, a, b, ratio, verdict in count_rows:
        say(f"| {fig} | {a} | {b} | {fmt(ratio)} | {verdict} |")
    say("")
if time_rows:
    say(f"Timing, alternated over {rounds} round(s) (medians of each run; B/A > 1 is slower for µs, faster for MB/s):")
    say("")
    say("| figure | A per round | B per round | B/A per round | A median | B median | B/A | noise | verdict |")
    say("|---|---|---|---|---|---|---|---|---|")
    j = lambda vs, f=fmt: " ".join(f(v) for v in vs)
    for fig, va, vb, paired, ma, mb, ratio, noise, verdict in time_rows:
        say(f"| {fig} | {j(va)} | {j(vb)} | {j(paired, lambda v: f'{v:.3f}')} | {fmt(ma)} | {fmt(mb)} | "
            f"{fmt(ratio)} | {'-' if noise is None else f'{noise * 100:.1f} %'} | {verdict} |")
    say("")
say("For docs/PERFORMANCE.md:")
say("")
for command, day, cluster in metas:
    say(f"Command: `{command}` ({day}, cluster `{cluster}`).")
say("")
if count_rows:
    say("Instructions are callgrind's, on the echo rank (rank 1) of a ping-pong; per round trip (one read, one "
        "release, one write) the count fitted as a + b * round trips + e * poll calls beyond one per round trip "
        "over all runs, b shown with its standard error where not exact. Timing figures: median (min-max) over "
        "the alternated rounds.")
    say("")
say(f"| figure | {rev_a} (A) | {rev_b} (B) | B/A | target |")
say("|---|---|---|---|---|")
for fig, a, b, ratio, verdict in count_rows:
    say(f"| {fig} | {a} | {b} | {fmt(ratio)} | {'+3 %: ' + verdict if verdict != '-' else '-'} |")

for fig, va, vb, paired, ma, mb, ratio, noise, verdict in time_rows:
    rng = lambda v, m: f"{fmt(m)} ({fmt(min(v))}-{fmt(max(v))})" if len(v) > 1 else fmt(m)
    say(f"| {fig} | {rng(va, ma)} | {rng(vb, mb)} | {fmt(ratio)} | noise "
        f"{'-' if noise is None else f'{noise * 100:.1f} %'}: {verdict} |")
print("\n".join(lines))
EOF
log "results in $out (summary.md, counts.tsv, timing.tsv, raw.log, callgrind/)"
