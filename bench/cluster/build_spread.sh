#!/bin/bash
# build_spread.sh: the 16 B eth one-way time of several revisions, each built with several
# codegen-unit counts, so that a change is judged against how far builds of one source
# differ (docs/DESIGN-NOTES.md, "Latency A/Bs need several builds of each side").
#
# usage: bash bench/cluster/build_spread.sh CLUSTER REV [REV ...]
#   CLUSTER  a 2-node cluster (quiver cluster up CLUSTER --nodes 2 --link 100mbit)
#   REV      a git revision (commit, branch, tag); each is checked out in a worktree
# knobs: CGUS (codegen-unit counts, default "3 4 5"), ROUNDS (alternations, default 6),
#        ITERS (ping-pong iterations per run, default 30000), SIZE (default 16),
#        OUT (default target/build-spread).
# Prints one line per run (revision, codegen units, round, median one-way µs) and, per
# binary, the median over the rounds. The machine's phase can change within a session:
# compare binaries within a round, and rerun when the rounds disagree.
set -euo pipefail
cluster=${1:?usage: build_spread.sh CLUSTER REV [REV ...]}
shift
[ $# -ge 1 ] || { echo "build_spread.sh: name at least one revision" >&2; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/target/build-spread}
cgus=${CGUS:-3 4 5}
rounds=${ROUNDS:-6}
iters=${ITERS:-30000}
size=${SIZE:-16}
mkdir -p "$out"
trees=()
cleanup() { for t in "${trees[@]}"; do git -C "$root" worktree remove --force "$t" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT

bins=()
for rev in "$@"; do
    sha=$(git -C "$root" rev-parse --short "$rev")
    tree="$out/tree-$sha"
    git -C "$root" worktree add -f --detach "$tree" "$sha" >/dev/null
    trees+=("$tree")
    for cg in $cgus; do
        echo "building $sha with codegen-units $cg" >&2
        (cd "$tree" && CARGO_PROFILE_RELEASE_CODEGEN_UNITS=$cg \
            cargo build -q --release -p quiver-cli --target-dir "$out/target-$sha-$cg")
        cp "$out/target-$sha-$cg/release/quiver" "$out/quiver-$sha-$cg"
        bins+=("$sha-$cg")
    done
done

results="$out/runs.tsv"
: >"$results"
for round in $(seq 1 "$rounds"); do
    for b in "${bins[@]}"; do
        us=$("$out/quiver-$b" bench pingpong --cluster "$cluster" --transport eth --wait spin \
            --sizes "$size" --iters "$iters" --format csv |
            awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "latency_us_median") c = i }
                     NR == 2 { print $c }')
        printf '%s\t%s\t%s\n' "$b" "$round" "$us" | tee -a "$results"
    done
done
echo "median one-way (µs) per binary over $rounds rounds:"
for b in "${bins[@]}"; do
    awk -v b="$b" '$1 == b { print $3 }' "$results" | sort -n |
        awk -v b="$b" '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%s\t%.3f\n", b, m }'
done
