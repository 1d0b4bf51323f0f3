#!/bin/bash
# valgrind_echo.sh: counts what quiver's echo rank executes per ping-pong message. Rank 1
# (the echo side) of a two-node eth ping-pong runs under a valgrind tool; rank 0 runs
# plain. The counts are exact (no timing noise), so they show how much work the user-space
# path does per message and how large its code is: docs/PERFORMANCE.md, "What quiver's
# user-space path is made of (session 15)".
#
# usage: bash bench/cluster/valgrind_echo.sh CLUSTER [callgrind|cachegrind [I1]]
#   CLUSTER  a 2-node cluster (quiver cluster up CLUSTER --nodes 2 --link 100mbit)
#   I1       cachegrind's simulated instruction cache, SIZE,ASSOC,LINE (default
#            32768,8,64); the data cache gets the same; misses per message at several
#            sizes give the size of the code run per message
# knobs: QUIVER (default target/release/quiver), ITERS (default 20000), OUT (default
#        /tmp/valgrind-echo.out).
# Then: callgrind_annotate --inclusive=yes OUT (instructions of each function, for
# ITERS + 100 messages) or the summary lines printed for cachegrind.
set -euo pipefail
cluster=${1:?usage: valgrind_echo.sh CLUSTER [callgrind|cachegrind [I1]]}
tool=${2:-callgrind}
cache=${3:-32768,8,64}
quiver=$(realpath "${QUIVER:-target/release/quiver}")
iters=${ITERS:-20000}
out=${OUT:-/tmp/valgrind-echo.out}
command -v valgrind >/dev/null || { echo "valgrind_echo.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
case "$tool" in
  callgrind) vg="valgrind --tool=callgrind --callgrind-out-file=$out" ;;
  cachegrind) vg="valgrind --tool=cachegrind --cache-sim=yes --I1=$cache --D1=$cache --LL=1048576,16,64 --cachegrind-out-file=$out" ;;
  *) echo "valgrind_echo.sh: tool must be callgrind or cachegrind" >&2; exit 2 ;;
esac
bench="$quiver bench pingpong --transport eth --wait spin --sizes 16 --iters $iters --warmup 100 --format json"
# The variables a benchmark child reads (bench::launch::child_env), so that `quiver run`
# starts the two ranks of one ping-pong directly.
export QUIVER_BENCH_CHILD=1 QUIVER_TRANSPORT=eth QUIVER_WAIT=spin
"$quiver" run --cluster "$cluster" -n 2 -- sh -c "if [ \"\$QUIVER_RANK\" = 1 ]; then exec $vg $bench; else exec $bench; fi"
