#!/usr/bin/env bash
# Paired A/B of two builds of quiver's libmpi.so.12 between the two nodes of an emulated
# cluster, the second also with QUIVER_ETH_UDP_RUNS=off (raw frames only), alternated
# ROUNDS times; prints IMB's figures per size (t[usec]/Mbytes/sec) on one line per run.
#
# usage: bench/mpi-ab-pair.sh CLUSTER ROUNDS LIB_A LIB_B IMB-PROGRAM [IMB ARGS...]
#   LIB_A, LIB_B: directories holding a libmpi.so.12 each (copies of
#   target/release/libmpi.so of the two builds), e.g.
#   bench/mpi-ab-pair.sh s42 3 /tmp/libA /tmp/libB IMB-P2P PingPong -msglog 3:22 -time 0.3
set -euo pipefail
C=$1 R=$2 A=$3 B=$4
shift 4
cd "$(dirname "$0")/.."
for r in $(seq "$R"); do
  for v in A B C; do
    case $v in
      A) lib=$A extra=() ;;
      B) lib=$B extra=() ;;
      C) lib=$B extra=(QUIVER_ETH_UDP_RUNS=off) ;;
    esac
    printf '%s r%s: ' "$v" "$r"
    env "${extra[@]}" QUIVER_MPI_LIB="$lib" timeout 600 target/release/quiver run --cluster "$C" \
      --mpi --pin --no-prefix -n 2 -- target/mpi-wheels/impi_rt/bin/"$@" 2>&1 |
      grep -E '^ +[0-9]+ ' |
      awk '{ if (NF >= 5) printf "%s=%s/%s ", $1, $3, $4; else printf "%s=%s ", $1, $3 } END { print "" }'
  done
done
