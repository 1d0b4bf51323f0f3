#!/usr/bin/env bash
# What the Python bindings add to a ping-pong inside the node, in one run: the 8-byte
# one-way latency of examples/python/pingpong.py against `quiver bench pingpong` over
# shared memory, for the tagged API (Send/Recv of numpy arrays against Tagged::send/recv)
# and for endpoints (write/read against Endpoint::write/read), alternating, REPS times.
# Both wait by spinning (QUIVER_WAIT=spin, quiver bench's default) with rank R pinned to
# the (R mod K)-th of the K CPUs this shell may use, as `quiver bench` pins its ranks.
# Both report the median of per-round-trip samples (round trip / 2) after a warm-up;
# Python's samples include its clock reads (time.perf_counter_ns, tens of ns), charged
# to the bindings.
#
# usage: bash bench/python_overhead.sh   (REPS=3, SIZE=8, ITERS=200000; about 10 s)
# Needs target/release/quiver and a Python with the package installed: $PYTHON, else
# target/python/venv/bin/python (made by .ci/python.sh), else python3.
set -euo pipefail
REPS=${REPS:-3}
SIZE=${SIZE:-8}
ITERS=${ITERS:-200000}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
Q=$root/target/release/quiver
[ -x "$Q" ] || cargo build --release -q -p quiver-cli
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x target/python/venv/bin/python ] && PYTHON=$root/target/python/venv/bin/python
fi
"$PYTHON" -c 'import quiver, numpy' 2>/dev/null || {
    echo "bench/python_overhead.sh: $PYTHON cannot import quiver and numpy (bash .ci/python.sh," \
        "or pip install ./python numpy, then PYTHON=...)" >&2
    exit 1
}
export QUIVER_WAIT=spin
cpus=$("$PYTHON" -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')
median() { sed -n 's/.*"latency_us_median": *\([0-9.]*\).*/\1/p' | head -1; }

rust() {   # API -> one-way median in us
    "$Q" bench pingpong --api "$1" --sizes "$SIZE" --iters "$ITERS" --warmup $((ITERS / 10)) \
        --format json | median
}

python() {   # API -> one-way median in us
    CPUS="$cpus" "$Q" run -n 2 --no-prefix -- sh -c \
        'n=$(echo $CPUS | wc -w); cpu=$(echo $CPUS | cut -d" " -f$((QUIVER_RANK % n + 1)));
         exec taskset -c "$cpu" "$@"' sh \
        "$PYTHON" examples/python/pingpong.py --api "$1" --sizes "$SIZE" --iters "$ITERS" \
        --warmup $((ITERS / 10)) --json | median
}

printf '# %s B one-way latency over shm (us, median), QUIVER_WAIT=spin, ranks pinned to CPUs %s\n' \
    "$SIZE" "$cpus"
printf '%-4s %-10s %10s %10s %10s\n' rep api rust python added
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for rep in $(seq "$REPS"); do
    for api in tagged endpoint; do
        rapi=$api
        [ "$api" = endpoint ] && rapi=dm
        r=$(rust "$rapi")
        p=$(python "$api")
        printf '%-4s %-10s %10s %10s %10.3f\n' "$rep" "$api" "$r" "$p" "$(awk "BEGIN {print $p - $r}")" \
            | tee -a "$rows"
    done
done
# The median over the repetitions of each column.
for api in tagged endpoint; do
    awk -v api="$api" 'BEGIN { n = 0 }  # (unset, n would index "" at first)
        $2 == api { r[n] = $3; p[n] = $4; a[n] = $5; n++ }
        function med(x,   i, j, t) {
            for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
            return n % 2 ? x[int(n / 2)] : (x[n / 2 - 1] + x[n / 2]) / 2
        }
        END { printf "%-4s %-10s %10.3f %10.3f %10.3f\n", "med", api, med(r), med(p), med(a) }' "$rows"
done
